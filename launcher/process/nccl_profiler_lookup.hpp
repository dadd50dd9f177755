#pragma once
// Where ddprun's NCCL profiler plugin is, and whether to hand it to the workers. The plugin
// (worker/nccl_profiler: libddprun-nccl-profiler.so) is installed in the lib dir beside
// ddprun (<prefix>/<libdir>, or build/lib beside build/bin/ddprun) and records any NCCL
// program's collectives in its record page; ddprun names it in the workers'
// NCCL_PROFILER_PLUGIN unless the user named a plugin there (theirs wins). NCCL loads it into
// every worker, so ddprun takes it only from its own installation, and only where no user but
// root and the one running ddprun can change it. Internal to the launcher.

#include <sys/types.h>

#include <filesystem>
#include <map>
#include <string>

namespace ddp::launcher {

// NCCL's variable naming the profiler plugin to load.
inline constexpr const char* kNcclProfilerPluginVariable = "NCCL_PROFILER_PLUGIN";

struct NcclProfilerPlugin {
  std::filesystem::path path;  // empty: set no NCCL_PROFILER_PLUGIN
  std::string notice;          // why not, when the user should know ("": say nothing)
};

// The plugin beside `program` (ddprun's own path): <program's folder>/../lib or
// ../<install libdir>, canonical. Empty, silently, when env names a plugin already or has
// DDPRUN_NCCL_PROFILER=0; empty with a notice when NCCL would load another profiler plugin
// without NCCL_PROFILER_PLUGIN (a libnccl-profiler.so the worker's loader finds, or a net
// plugin that exports one), or when ours is missing or untrusted for `user`
// (trusted_path.hpp: the file, or a folder on the way to it, could be changed by another user).
NcclProfilerPlugin find_nccl_profiler(const std::filesystem::path& program,
                                      const std::map<std::string, std::string>& env, uid_t user);
// The same beside the running ddprun (/proc/self/exe), for its effective user.
NcclProfilerPlugin find_nccl_profiler(const std::map<std::string, std::string>& env);

}  // namespace ddp::launcher
