// spawn_process on a kernel without close_range(CLOSE_RANGE_CLOEXEC) (before 5.11: Debian 11's
// 5.10), made here with a seccomp filter: the child still marks every open descriptor
// close-on-exec, with one fcntl per descriptor open, not one per descriptor RLIMIT_NOFILE allows
// (2^30 under container runtimes: minutes per worker).
#include "ddp/launcher/spawn_process.hpp"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <fstream>

#include "skip.hpp"
#include "test_support.hpp"

using namespace ddp::launcher;

namespace {

#if defined(__x86_64__)
constexpr std::uint32_t kAuditArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr std::uint32_t kAuditArch = AUDIT_ARCH_AARCH64;
#endif

// From here on in this process and its children: close_range fails with ENOSYS, and an fcntl on
// a descriptor at or above `trap` kills the process that makes it (a descriptor that high is
// not open: only a loop over every possible descriptor reaches it).
bool hide_close_range(std::uint32_t trap) {
  sock_filter program[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kAuditArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_close_range, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_fcntl, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0])),  // low half: the fd
      BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, trap, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog filter{static_cast<unsigned short>(sizeof program / sizeof program[0]), program};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &filter) == 0;
}

// The open-file limit as high as this process may set it: the kernel's own bound (nr_open)
// where allowed (root), else the hard limit.
rlim_t raise_nofile() {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  rlim_t nr_open = 0;
  std::ifstream("/proc/sys/fs/nr_open") >> nr_open;
  rlimit highest{nr_open, nr_open};
  if (nr_open > limit.rlim_max && ::setrlimit(RLIMIT_NOFILE, &highest) == 0) return nr_open;
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);
  ::getrlimit(RLIMIT_NOFILE, &limit);
  return limit.rlim_cur;
}

// How the child below ended (its exit status).
enum Outcome : int {
  kSpawned = 0,       // the worker ran and exited 0: its descriptors are in the output file
  kLowLimit = 2,      // RLIMIT_NOFILE too low for the test to mean anything
  kNoFilter = 3,      // seccomp refused
  kWorkerKilled = 4,  // the worker died by a signal: the filter's trap
  kWorkerFailed = 5,  // the worker exited non-zero, or the spawn failed
};

constexpr int kInherited = 20;  // a descriptor the worker is to keep (SpawnOptions::inherit_fds)

// In a child (the filter and the limit stay with it): descriptors open without close-on-exec
// at 10 and just below the trap, then a spawn of ddp-sample-worker --fds. Writes how long the
// spawn and the worker's run took to `timing`.
[[noreturn]] void spawn_without_close_range(const std::string& out_path,
                                            const std::string& timing) {
  const rlim_t limit = raise_nofile();
  if (limit < 4096) ::_exit(kLowLimit);
  const auto trap = static_cast<std::uint32_t>(limit / 2);
  const int null_fd = ::open("/dev/null", O_RDONLY);
  if (::dup2(null_fd, 10) < 0 || ::dup2(null_fd, kInherited) < 0 ||
      ::dup2(null_fd, static_cast<int>(trap) - 1) < 0) {
    ::_exit(kLowLimit);
  }
  const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (!hide_close_range(trap)) ::_exit(kNoFilter);
  if (::syscall(SYS_close_range, 3U, ~0U, 0U) != -1 || errno != ENOSYS) ::_exit(kNoFilter);
  SpawnOptions options;
  options.program = ddp::test::bin_path("ddp-sample-worker").string();
  options.argv = {"ddp-sample-worker", "--fds"};
  options.env = {"RANK=0"};
  options.stdout_fd = out;
  options.inherit_fds = {kInherited};
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  try {
    SpawnedProcess process = spawn_process(options);
    confirm_exec(process);
    while (::waitpid(process.pid, &status, 0) < 0 && errno == EINTR) {
    }
  } catch (const SpawnError&) {
    ::_exit(kWorkerFailed);
  }
  const auto took = std::chrono::steady_clock::now() - start;
  std::ofstream(timing) << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                        << " ms with RLIMIT_NOFILE " << limit;
  if (WIFSIGNALED(status)) ::_exit(kWorkerKilled);
  ::_exit(WIFEXITED(status) && WEXITSTATUS(status) == 0 ? kSpawned : kWorkerFailed);
}

}  // namespace

TEST_CASE("without close_range, every open descriptor becomes close-on-exec, whatever the limit") {
  ddp::test::TempDir dir;
  const std::string out = (dir.path() / "fds").string();
  const std::string timing = (dir.path() / "timing").string();
  const pid_t pid = ::fork();
  if (pid == 0) spawn_without_close_range(out, timing);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == kLowLimit) return ddp::test::skip("RLIMIT_NOFILE is below 4096 here");
  if (WEXITSTATUS(status) == kNoFilter) return ddp::test::skip("no seccomp filter here");
  std::string took;
  std::getline(std::ifstream(timing), took);
  INFO("the spawn and the worker's run: " << took);
  // Killed: the child looped over descriptors that are not open, up to the limit.
  REQUIRE(WEXITSTATUS(status) == kSpawned);
  std::string fds;
  std::getline(std::ifstream(out), fds);
  CHECK(fds == "fds rank=0: 0 1 2 " + std::to_string(kInherited));  // not 10, not the high one
}
