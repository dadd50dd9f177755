#pragma once
// Paths and scratch space shared by the tests.

#include <filesystem>
#include <string>

namespace ddp::test {

// build/bin/<name>
std::filesystem::path bin_path(const std::string& name);
// <source tree>/<relative>
std::filesystem::path source_path(const std::string& relative);
// The interpreter with python3-torch (Debian's /usr/bin/python3).
std::string torch_python();
// True when torch_python() can import torch with Gloo.
bool torch_available();

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace ddp::test
