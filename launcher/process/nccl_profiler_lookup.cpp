#include "nccl_profiler_lookup.hpp"

#include <unistd.h>

#include <system_error>
#include <vector>

#include "trusted_path.hpp"

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

}  // namespace

NcclProfilerPlugin find_nccl_profiler(const fs::path& program,
                                      const std::map<std::string, std::string>& env, uid_t user) {
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
    if (const auto untrusted = untrusted_path(plugin, user)) {
      return {{},
              "ddprun: the NCCL profiler plugin is off: " + untrusted->path.string() + " " +
                  untrusted->why + ", so another user could replace the library that NCCL " +
                  "would load into every worker; " + untrusted->fix +
                  ", or install ddprun where only root can write"};
    }
    return {fs::canonical(plugin, ec), ""};
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
  return find_nccl_profiler(program, env, ::geteuid());
}

}  // namespace ddp::launcher
