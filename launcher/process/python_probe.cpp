#include "python_probe.hpp"

#include <sys/stat.h>

#include <system_error>

namespace ddp::launcher {
namespace fs = std::filesystem;

namespace {

bool world_writable(const fs::path& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && (info.st_mode & S_IWOTH) != 0;
}

}  // namespace

PythonProbeDir find_python_probe(bool enabled, const std::map<std::string, std::string>& env) {
  const auto off = env.find(kPythonProbeVariable);
  if (!enabled || (off != env.end() && off->second == "0")) return {};
  std::error_code ec;
  const fs::path program = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {{}, "ddprun: the Python probe is off: cannot tell where ddprun is installed"};
  const fs::path dir =
      (program.parent_path().parent_path() / "share" / "ddprun" / "python").lexically_normal();
  if (!fs::is_regular_file(dir / "sitecustomize.py", ec)) {
    return {{},
            "ddprun: the Python probe is off: " + (dir / "sitecustomize.py").string() +
                " is missing (reinstall ddprun); PyTorch jobs run without collective "
                "records and live stacks"};
  }
  for (const fs::path& path : {dir, dir / "sitecustomize.py", dir / "_ddprun_probe.py"}) {
    if (world_writable(path)) {
      return {{},
              "ddprun: the Python probe is off: " + path.string() +
                  " is writable by every user, and a sitecustomize there would run in every "
                  "worker; make it writable by its owner only (chmod o-w)"};
    }
  }
  return {dir, ""};
}

}  // namespace ddp::launcher
