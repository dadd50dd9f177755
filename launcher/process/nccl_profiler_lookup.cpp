#include "nccl_profiler_lookup.hpp"

#include <sys/stat.h>

#include <system_error>
#include <vector>

namespace ddp::launcher {
namespace fs = std::filesystem;

namespace {

inline constexpr const char* kPluginFile = "libddprun-nccl-profiler.so";
// Where the lib dir is, relative to the prefix, once installed (GNUInstallDirs).
#ifdef DDP_INSTALL_LIBDIR
inline constexpr const char* kInstallLibDir = DDP_INSTALL_LIBDIR;
#else
inline constexpr const char* kInstallLibDir = "lib";
#endif

bool world_writable(const fs::path& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && (info.st_mode & S_IWOTH) != 0;
}

}  // namespace

NcclProfilerPlugin find_nccl_profiler(const fs::path& program,
                                      const std::map<std::string, std::string>& env) {
  if (env.contains(kNcclProfilerPluginVariable)) return {};  // the user's choice
  const auto off = env.find(kNcclProfilerVariable);
  if (off != env.end() && off->second == "0") return {};
  const fs::path prefix = program.parent_path().parent_path();
  std::vector<fs::path> candidates = {(prefix / "lib" / kPluginFile).lexically_normal()};
  if (fs::path(kInstallLibDir) != "lib") {
    candidates.push_back((prefix / kInstallLibDir / kPluginFile).lexically_normal());
  }
  std::error_code ec;
  for (const fs::path& plugin : candidates) {
    if (!fs::is_regular_file(plugin, ec)) continue;
    for (const fs::path& path : {plugin.parent_path(), plugin}) {
      if (world_writable(path)) {
        return {{},
                "ddprun: the NCCL profiler plugin is off: " + path.string() +
                    " is writable by every user, and NCCL would load a library from there "
                    "into every worker; make it writable by its owner only (chmod o-w)"};
      }
    }
    return {plugin, ""};
  }
  return {{},
          "ddprun: the NCCL profiler plugin is off: " + candidates.back().string() +
              " is missing (reinstall ddprun); NCCL workers without libddp or the Python "
              "probe run without collective records"};
}

NcclProfilerPlugin find_nccl_profiler(const std::map<std::string, std::string>& env) {
  std::error_code ec;
  const fs::path program = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {{}, "ddprun: the NCCL profiler plugin is off: cannot tell where ddprun is"};
  return find_nccl_profiler(program, env);
}

}  // namespace ddp::launcher
