// packaging/glibc_compat.cpp's random bytes (the packaged programs' arc4random,
// std::random_device's source) where the getrandom system call is missing: a seccomp filter makes
// it fail with ENOSYS, as on a kernel before 3.17 or under a container's filter that does not know
// it. The source falls back to /dev/urandom, as glibc does, instead of aborting the program.
#include "glibc_compat.h"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstddef>
#include <cstdint>

namespace {

#if defined(__x86_64__)
constexpr std::uint32_t kAuditArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr std::uint32_t kAuditArch = AUDIT_ARCH_AARCH64;
#endif

// From here on, getrandom fails with ENOSYS in this process (and only that system call).
bool hide_getrandom() {
  sock_filter program[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kAuditArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getrandom, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog filter{static_cast<unsigned short>(sizeof program / sizeof program[0]), program};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &filter) == 0;
}

// What the child found, as its exit status.
enum Outcome : int { kBytes = 0, kNoFilter = 2, kFilterNotApplied = 3, kAllZero = 4 };

// In a child (the filter cannot be taken back): 64 random bytes with getrandom hidden. A child
// that aborts ends by SIGABRT.
int random_bytes_without_getrandom() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!hide_getrandom()) ::_exit(kNoFilter);
    char probe;
    if (::getrandom(&probe, 1, 0) != -1 || errno != ENOSYS) ::_exit(kFilterNotApplied);
    unsigned char bytes[64] = {};
    ddp_compat_random_bytes(bytes, sizeof bytes);
    unsigned char any = 0;
    for (unsigned char b : bytes) any |= b;
    ::_exit(any != 0 ? kBytes : kAllZero);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

}  // namespace

TEST_CASE("random bytes come from getrandom, or from /dev/urandom where getrandom is missing") {
  unsigned char a[32] = {}, b[32] = {};
  ddp_compat_random_bytes(a, sizeof a);
  ddp_compat_random_bytes(b, sizeof b);
  CHECK(std::equal(a, a + sizeof a, b) == false);

  const int status = random_bytes_without_getrandom();
  INFO("child status " << status);
  REQUIRE_FALSE(WIFSIGNALED(status));  // SIGABRT: no fallback
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == kBytes);
}
