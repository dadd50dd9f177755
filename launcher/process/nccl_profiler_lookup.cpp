#include "process/nccl_profiler_lookup.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <system_error>
#include <vector>

#include "ddp/common/worker_contract.hpp"
#include "process/trusted_path.hpp"

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

std::string value_of(const std::map<std::string, std::string>& env, const char* name) {
  const auto it = env.find(name);
  return it == env.end() ? std::string() : it->second;
}

// The whole file, or "" when it cannot be read (bounded: a cache or library is small).
std::string contents(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::string text;
  char buffer[1 << 16];
  while (in && text.size() < (std::size_t{256} << 20)) {
    in.read(buffer, sizeof buffer);
    text.append(buffer, static_cast<std::size_t>(in.gcount()));
  }
  return text;
}

// Where the dynamic loader of a worker with `env` would find the library `name` (a bare file
// name, as NCCL dlopens it): LD_LIBRARY_PATH's folders, then the loader's cache
// (/etc/ld.so.cache names each library's path), then the default folders. Empty: nowhere.
fs::path loader_finds(const std::string& name, const std::map<std::string, std::string>& env) {
  std::error_code ec;
  const std::string search = value_of(env, "LD_LIBRARY_PATH");
  for (std::size_t start = 0; start <= search.size();) {
    const std::size_t end = std::min(search.find(':', start), search.size());
    const std::string folder = search.substr(start, end - start);
    if (!folder.empty() && fs::is_regular_file(fs::path(folder) / name, ec)) {
      return fs::path(folder) / name;
    }
    start = end + 1;
  }
  // The cache's string table holds "<folder>/<name>\0" for each library it knows.
  const std::string cache = contents("/etc/ld.so.cache");
  const std::string needle = "/" + name + '\0';
  if (const std::size_t at = cache.find(needle); at != std::string::npos) {
    const std::size_t begin = cache.rfind('\0', at);
    const fs::path cached = cache.substr(begin == std::string::npos ? 0 : begin + 1,
                                         at + needle.size() - 1 - (begin + 1));
    if (fs::is_regular_file(cached, ec)) return cached;
  }
  for (const char* folder : {"/lib", "/usr/lib", "/lib64", "/usr/lib64"}) {
    if (fs::is_regular_file(fs::path(folder) / name, ec)) return fs::path(folder) / name;
  }
  return {};
}

// A profiler plugin NCCL would load in a worker with `env` if NCCL_PROFILER_PLUGIN stayed
// unset: a libnccl-profiler.so the loader finds, or a net plugin (NCCL_NET_PLUGIN's, else
// libnccl-net.so) that exports the profiler's ncclProfiler_v<N> structs (NCCL looks there next).
// Its path, or empty.
fs::path users_profiler(const std::map<std::string, std::string>& env) {
  if (fs::path found = loader_finds("libnccl-profiler.so", env); !found.empty()) return found;
  const std::string net = value_of(env, "NCCL_NET_PLUGIN");
  if (net == "none") return {};
  std::vector<fs::path> nets;
  std::error_code ec;
  if (net.empty()) {
    nets.push_back(loader_finds("libnccl-net.so", env));
  } else if (net.find('/') != std::string::npos) {
    nets.push_back(net);
  } else {
    nets.push_back(loader_finds("libnccl-net-" + net + ".so", env));
    nets.push_back(loader_finds(net, env));
  }
  for (const fs::path& library : nets) {
    if (library.empty() || !fs::is_regular_file(library, ec)) continue;
    // Its dynamic symbol names are in its string table: no code of it runs in ddprun.
    if (contents(library).find("ncclProfiler_v") != std::string::npos) return library;
  }
  return {};
}

}  // namespace

NcclProfilerPlugin find_nccl_profiler(const fs::path& program,
                                      const std::map<std::string, std::string>& env, uid_t user) {
  if (env.contains(kNcclProfilerPluginVariable)) return {};  // the user's choice
  const auto off = env.find(ddp::contract::kNcclProfiler);
  if (off != env.end() && off->second == "0") return {};
  if (const fs::path theirs = users_profiler(env); !theirs.empty()) {
    // NCCL loads that one when NCCL_PROFILER_PLUGIN is unset: naming ours would displace it.
    return {{},
            "ddprun: leaves NCCL_PROFILER_PLUGIN unset: NCCL loads the profiler plugin " +
                theirs.string() +
                " without it, and ddprun's would take its place; NCCL programs without libddp "
                "or the Python probe run without collective records (name one in "
                "NCCL_PROFILER_PLUGIN to choose)"};
  }
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
