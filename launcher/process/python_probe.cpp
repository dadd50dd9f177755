#include "process/python_probe.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <system_error>

#include "ddp/common/worker_contract.hpp"
#include "process/trusted_path.hpp"

namespace ddp::launcher {
namespace fs = std::filesystem;

namespace {

// Python makes __pycache__ with mode 0777 less the umask: under a umask of 002 another member
// of the group could plant byte-code there. Made here first, 0755, in a folder of the user's
// (root's folders get theirs from the package, or from Python run as root).
void make_bytecode_folder(const fs::path& dir, uid_t user) {
  struct stat info {};
  if (::stat(dir.c_str(), &info) != 0 || info.st_uid != user) return;
  ::mkdir((dir / "__pycache__").c_str(), 0755);  // EEXIST and the like: checked next
}

// Where Python reads the probe's byte-code when PYTHONPYCACHEPREFIX is set (in place of
// __pycache__): <prefix>/<the folder's absolute path>. What exists of it must be trusted: its
// nearest existing folder and what is in it (the folders still missing are made by Python,
// for the user, where no other user could make them first).
std::optional<UntrustedPath> untrusted_cache_prefix(const fs::path& dir,
                                                    const std::map<std::string, std::string>& env,
                                                    uid_t user) {
  const auto prefix = env.find("PYTHONPYCACHEPREFIX");
  if (prefix == env.end() || prefix->second.empty()) return std::nullopt;
  std::error_code ec;
  const fs::path canonical = fs::canonical(dir, ec);
  const fs::path cache = fs::absolute(prefix->second, ec) / canonical.relative_path();
  if (fs::is_directory(cache, ec)) return untrusted_folder(cache, user);
  fs::path existing = cache.parent_path();
  while (!fs::exists(existing, ec) && existing.has_relative_path()) {
    existing = existing.parent_path();
  }
  return untrusted_path(existing, user);  // a folder there nobody else can write
}

}  // namespace

PythonProbeDir find_python_probe(const fs::path& program, bool enabled,
                                 const std::map<std::string, std::string>& env, uid_t user) {
  const auto off = env.find(ddp::contract::kPythonProbe);
  if (!enabled || (off != env.end() && off->second == "0")) return {};
  const fs::path dir =
      (program.parent_path().parent_path() / "share" / "ddprun" / "python").lexically_normal();
  std::error_code ec;
  if (!fs::is_regular_file(dir / "sitecustomize.py", ec)) {
    return {{},
            "ddprun: the Python probe is off: " + (dir / "sitecustomize.py").string() +
                " is missing (reinstall ddprun); PyTorch jobs run without collective "
                "records and live stacks"};
  }
  make_bytecode_folder(dir, user);
  auto untrusted = untrusted_folder(dir, user);
  if (!untrusted) untrusted = untrusted_cache_prefix(dir, env, user);
  if (untrusted) {
    return {{},
            "ddprun: the Python probe is off: " + untrusted->path.string() + " " + untrusted->why +
                ", so another user could put code there that would run in " + "every worker; " +
                untrusted->fix +
                ", or install ddprun where only root can "
                "write"};
  }
  return {fs::canonical(dir, ec), ""};
}

PythonProbeDir find_python_probe(bool enabled, const std::map<std::string, std::string>& env) {
  std::error_code ec;
  const fs::path program = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {{}, "ddprun: the Python probe is off: cannot tell where ddprun is installed"};
  return find_python_probe(program, enabled, env, ::geteuid());
}

void add_python_probe_path(std::vector<std::string>& env, const fs::path& dir) {
  const std::string key = "PYTHONPATH=";
  const std::string saved_key = std::string(ddp::contract::kUserPythonPath) + "=";
  std::erase_if(env, [&](const std::string& e) { return e.starts_with(saved_key); });
  auto path = std::find_if(env.begin(), env.end(),
                           [&](const std::string& e) { return e.starts_with(key); });
  if (path == env.end()) {
    env.push_back(key + dir.string());
    return;
  }
  const std::string user_value = path->substr(key.size());
  *path = key + dir.string() + (user_value.empty() ? "" : ":" + user_value);
  env.push_back(saved_key + user_value);
}

}  // namespace ddp::launcher
