// What the packaged programs (ddprun, ddpstore) need from a glibc newer than the one they are
// linked against. scripts/package builds them with Debian 12's GCC 12 over Debian 11's glibc
// 2.31 (cmake/DdpSysroot.cmake; docs/install.md says why), and links GCC's own runtime in
// (DDP_PORTABLE). That runtime, libstdc++.a and libgcc_eh.a, was built against Debian 12's
// glibc 2.36 and takes three things from it that glibc 2.31 lacks; and our code calls
// sigabbrev_np (glibc 2.32, declared for it by glibc_compat.h). Each is defined here only when
// the glibc compiled against lacks it, and hidden: they serve the program's own code and copy
// of the runtime, and are never exported to the libraries it loads. Linked into the packaged
// programs and the NCCL profiler plugin only (CMakeLists.txt).
#include "glibc_compat.h"

#include <features.h>

#if !__GLIBC_PREREQ(2, 32)
#include <csignal>

namespace {

struct SignalName {
  int number;
  const char* name;
};

// glibc's names: SIGIO is "POLL" there (the same number).
constexpr SignalName kSignalNames[] = {
    {SIGHUP, "HUP"},   {SIGINT, "INT"},       {SIGQUIT, "QUIT"}, {SIGILL, "ILL"},
    {SIGTRAP, "TRAP"}, {SIGABRT, "ABRT"},     {SIGBUS, "BUS"},   {SIGFPE, "FPE"},
    {SIGKILL, "KILL"}, {SIGUSR1, "USR1"},     {SIGSEGV, "SEGV"}, {SIGUSR2, "USR2"},
    {SIGPIPE, "PIPE"}, {SIGALRM, "ALRM"},     {SIGTERM, "TERM"}, {SIGSTKFLT, "STKFLT"},
    {SIGCHLD, "CHLD"}, {SIGCONT, "CONT"},     {SIGSTOP, "STOP"}, {SIGTSTP, "TSTP"},
    {SIGTTIN, "TTIN"}, {SIGTTOU, "TTOU"},     {SIGURG, "URG"},   {SIGXCPU, "XCPU"},
    {SIGXFSZ, "XFSZ"}, {SIGVTALRM, "VTALRM"}, {SIGPROF, "PROF"}, {SIGWINCH, "WINCH"},
    {SIGPOLL, "POLL"}, {SIGPWR, "PWR"},       {SIGSYS, "SYS"},
};

}  // namespace

// glibc 2.32+: "TERM" for SIGTERM, null for a number that names no signal.
extern "C" __attribute__((visibility("hidden"))) const char* sigabbrev_np(int signal) noexcept {
  for (const SignalName& known : kSignalNames) {
    if (known.number == signal) return known.name;
  }
  return nullptr;
}

// glibc 2.32+: nonzero while the process is known to have one thread, so that libstdc++ may
// count references without atomic instructions. Zero is always correct: "maybe several
// threads", and libstdc++ then always uses atomic instructions, as it does on glibc < 2.32.
extern "C" {
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;
}
#endif

#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>

namespace {

// Reads all of `size` bytes from `path`; false when it cannot be opened or read.
bool read_device(const char* path, char* bytes, std::size_t size) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return false;
  std::size_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, bytes + got, size - got);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fd);
  return got == size;
}

// Without getrandom, /dev/urandom gives bytes before the kernel's pool is seeded: wait until
// /dev/random is readable first (once it is, it stays so), as getrandom itself would wait.
void wait_until_seeded() {
  const int fd = ::open("/dev/random", O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return;
  pollfd ready{fd, POLLIN, 0};
  while (::poll(&ready, 1, -1) < 0 && errno == EINTR) {
  }
  ::close(fd);
}

}  // namespace

extern "C" __attribute__((visibility("hidden"))) void ddp_compat_random_bytes(
    void* buffer, std::size_t size) noexcept {
  auto* bytes = static_cast<char*>(buffer);
  std::size_t got = 0;
  while (got < size) {
    const ssize_t n = getrandom(bytes + got, size - got, 0);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == ENOSYS) {  // a kernel before 3.17, or a seccomp filter
      wait_until_seeded();
      if (!read_device("/dev/urandom", bytes + got, size - got)) std::abort();
      return;
    } else if (n == 0 || errno != EINTR) {
      std::abort();
    }
  }
}

#if !__GLIBC_PREREQ(2, 36)
#include <cstdint>

// glibc 2.36+: std::random_device's source in libstdc++. The same contract: random bits from
// the kernel (ddp_compat_random_bytes: getrandom, or /dev/urandom where the getrandom system
// call is missing, as glibc falls back), and no failure to return: without entropy the process
// aborts, as glibc's does.
extern "C" __attribute__((visibility("hidden"))) std::uint32_t arc4random() {
  std::uint32_t value;
  ddp_compat_random_bytes(&value, sizeof value);
  return value;
}
#endif

#if !__GLIBC_PREREQ(2, 35)
#include <link.h>

#include <cstddef>
#include <cstdint>

#if !defined(__x86_64__) && !defined(__aarch64__)
#error "struct dl_find_object below has the layout of x86_64 and aarch64 only"
#endif

// glibc 2.35's struct on x86_64 and aarch64 (no dlfo_eh_dbase, no dlfo_eh_count there).
struct dl_find_object {
  unsigned long long dlfo_flags;
  void* dlfo_map_start;
  void* dlfo_map_end;
  struct link_map* dlfo_link_map;
  void* dlfo_eh_frame;
  unsigned long long dlfo_reserved[7];
};

namespace {

struct Search {
  std::uintptr_t address;  // what is searched for
  dl_find_object* result;  // filled when found
};

// dl_iterate_phdr's callback: fills the result and stops (1) at the object whose loaded
// segments hold the address.
int find_object(dl_phdr_info* info, std::size_t, void* data) {
  auto* search = static_cast<Search*>(data);
  std::uintptr_t start = UINTPTR_MAX, end = 0, eh_frame = 0;
  bool holds = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    std::uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
    if (segment.p_type == PT_LOAD) {
      holds = holds || (search->address >= begin && search->address < begin + segment.p_memsz);
      start = begin < start ? begin : start;
      end = begin + segment.p_memsz > end ? begin + segment.p_memsz : end;
    } else if (segment.p_type == PT_GNU_EH_FRAME) {
      eh_frame = begin;
    }
  }
  if (!holds) {
    return 0;
  }
  *search->result = {};
  search->result->dlfo_map_start = reinterpret_cast<void*>(start);
  search->result->dlfo_map_end = reinterpret_cast<void*>(end);
  search->result->dlfo_eh_frame = reinterpret_cast<void*>(eh_frame);
  return 1;
}

}  // namespace

// glibc 2.35+: how GCC 12's unwinder (libgcc_eh.a) finds the unwind tables (.eh_frame_hdr) of
// the object that holds a return address, for every frame of a thrown exception. Found the
// way the unwinder itself did before GCC 12, walking the loaded objects with dl_iterate_phdr
// (under the loader's lock, as dlopen and dlclose take it). Returns 0 and fills `result`, or
// -1 if no loaded object holds `address`. dlfo_link_map is left null: libgcc reads only
// dlfo_eh_frame.
extern "C" __attribute__((visibility("hidden"))) int _dl_find_object(void* address,
                                                                     dl_find_object* result) {
  Search search{reinterpret_cast<std::uintptr_t>(address), result};
  return dl_iterate_phdr(find_object, &search) != 0 ? 0 : -1;
}
#endif
