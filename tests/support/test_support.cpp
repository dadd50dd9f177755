#include "test_support.hpp"

#include <unistd.h>

#include <cstdlib>
#include <random>
#include <system_error>

namespace ddp::test {

std::filesystem::path bin_path(const std::string& name) {
  return std::filesystem::path(DDP_BIN_DIR) / name;
}

std::filesystem::path source_path(const std::string& relative) {
  return std::filesystem::path(DDP_SOURCE_DIR) / relative;
}

std::string torch_python() { return DDP_TORCH_PYTHON; }

bool torch_available() {
  static const bool available = [] {
    std::string cmd = torch_python() +
                      " -c 'import torch.distributed as d; assert d.is_gloo_available()'"
                      " >/dev/null 2>&1";
    return std::system(cmd.c_str()) == 0;
  }();
  return available;
}

TempDir::TempDir() {
  std::random_device rd;
  auto base = std::filesystem::temp_directory_path();
  for (;;) {
    path_ = base / ("ddp-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    if (std::filesystem::create_directory(path_)) break;
  }
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace ddp::test
