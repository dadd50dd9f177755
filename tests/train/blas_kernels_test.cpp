// Which OpenBLAS kernels train_fashion_mnist runs with.
#include "blas_kernels.hpp"

#include <cblas.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "skip.hpp"
#include "test_support.hpp"

TEST_CASE("a core chosen with OPENBLAS_CORETYPE is left alone") {
  const char* before = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = before ? before : "";
  ::setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  CHECK(fmnist::better_blas_core() == nullptr);
  if (before) {
    ::setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  } else {
    ::unsetenv("OPENBLAS_CORETYPE");
  }
}

TEST_CASE("the trainer runs OpenBLAS's AVX kernels on a CPU that has AVX2") {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    return ddp::test::skip("this CPU has no AVX2 + FMA");
  }
  // OPENBLAS_VERBOSE=2 makes OpenBLAS print "Core: NAME" when it loads: once for the first
  // image, once more after a re-exec. The last one is what the trainer computes with.
  const auto result = ddp::test::run_shell("env -u OPENBLAS_CORETYPE OPENBLAS_VERBOSE=2 " +
                                               ddp::test::bin_path("train_fashion_mnist").string() +
                                               " --dump_init /dev/null",
                                           60);
  INFO(result.output << "OpenBLAS's own choice in this process: " << openblas_get_corename());
  REQUIRE(result.status == 0);
  const auto last = result.output.rfind("Core: ");
  REQUIRE(last != std::string::npos);
  const std::string core =
      result.output.substr(last + 6, result.output.find('\n', last) - last - 6);
  CHECK((core == "Haswell" || core == "SkylakeX" || core == "Zen" || core == "Cooperlake" ||
         core == "SapphireRapids" || core == "SandyBridge"));
  CHECK(core != "Prescott");
}
