#pragma once
// OpenBLAS chooses its sgemm kernels once, when it loads, from the CPU's model number.
// Debian 12's OpenBLAS (0.3.21) does not know the newer Xeon models some clouds expose
// ("Intel(R) Xeon(R) Processor") and falls back to its Prescott (SSE3) kernels: 4x slower
// than its AVX-512 kernels on the same CPU. The choice can only be overridden through
// OPENBLAS_CORETYPE before the library loads, i.e. before the process starts.

namespace fmnist {

// The OPENBLAS_CORETYPE this CPU should use when OpenBLAS picked a generic SSE core although
// the CPU has AVX-512 ("SkylakeX") or AVX2 + FMA ("Haswell"); nullptr when OpenBLAS's own
// choice stands (it chose a modern core, or OPENBLAS_CORETYPE is set already).
const char* better_blas_core();

// When better_blas_core() names a core, sets OPENBLAS_CORETYPE and replaces this process
// with itself (execv of /proc/self/exe: same pid, arguments and environment otherwise, so a
// launcher still sees the same worker). Returns only when there is nothing to do or the exec
// failed (then OpenBLAS's slower kernels are used, with a warning on stderr).
void reexec_with_better_blas_core(char** argv);

}  // namespace fmnist
