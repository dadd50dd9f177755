#pragma once
// Where ddprun's Python probe is, and whether to load it. The probe (worker/python in the
// source tree: sitecustomize.py and _ddprun_probe.py) is installed beside ddprun, in
// <prefix>/share/ddprun/python, and ddprun puts that folder first on Python workers'
// PYTHONPATH. A sitecustomize runs in every Python that sees it, so ddprun loads it only from
// its own installation, and only when no user but root and the one running ddprun can change
// anything on the way to it or in it (trusted_path.hpp). Internal to the launcher.

#include <sys/types.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace ddp::launcher {

struct PythonProbeDir {
  std::filesystem::path dir;  // empty: do not load the probe; else canonical
  std::string notice;         // why it is not loaded, when the user should know ("": say nothing)
};

// The probe's folder for `program` (ddprun's own path, canonical):
// <program's folder>/../share/ddprun/python, unless the probe is turned off (enabled false, or
// DDPRUN_PYTHON_PROBE=0 in env), missing (said in notice), or untrusted for `user`: the folder,
// a folder above it, or anything in it (its __pycache__ too: Python runs a .pyc planted there)
// could be changed by another user (refused, said in notice); with PYTHONPYCACHEPREFIX in env,
// the same for the folder there that Python would read the probe's byte-code from (or the
// nearest existing folder above it). A __pycache__ that is missing
// from a folder of `user` is made first, writable by its owner only, so that Python does not
// make it by a permissive umask.
PythonProbeDir find_python_probe(const std::filesystem::path& program, bool enabled,
                                 const std::map<std::string, std::string>& env, uid_t user);
// The same beside the running ddprun (/proc/self/exe), for its effective user.
PythonProbeDir find_python_probe(bool enabled, const std::map<std::string, std::string>& env);

// Puts `dir` first on the PYTHONPATH of `env` (KEY=VALUE entries), so that sitecustomize.py can
// give the worker back the user's value exactly: unset stays unset (PYTHONPATH=<dir>); a value
// V is kept in DDPRUN_PYTHONPATH and becomes <dir>:V, or <dir> alone for an empty V (Python
// reads a trailing empty entry as the current folder, which an empty PYTHONPATH does not add).
void add_python_probe_path(std::vector<std::string>& env, const std::filesystem::path& dir);

}  // namespace ddp::launcher
