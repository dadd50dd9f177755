#include "blas_kernels.hpp"

#include <cblas.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace fmnist {

namespace {

// OpenBLAS's x86-64 cores without AVX: what it falls back to for a model it does not know.
bool is_pre_avx_core(std::string name) {
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* legacy : {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom",
                             "unknown", "katmai", "coppermine", "northwood", "banias"}) {
    if (name == legacy) return true;
  }
  return false;
}

}  // namespace

const char* better_blas_core() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return nullptr;
  const char* current = openblas_get_corename();
  if (current == nullptr || !is_pre_avx_core(current)) return nullptr;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

void reexec_with_better_blas_core(char** argv) {
  const char* core = better_blas_core();
  if (core == nullptr) return;
  ::setenv("OPENBLAS_CORETYPE", core, 1);
  ::execv("/proc/self/exe", argv);
  std::fprintf(stderr,
               "train_fashion_mnist: warning: cannot restart with OPENBLAS_CORETYPE=%s (%s); "
               "using OpenBLAS's %s kernels, which are slower on this CPU\n",
               core, std::strerror(errno), openblas_get_corename());
  ::unsetenv("OPENBLAS_CORETYPE");
}

}  // namespace fmnist
