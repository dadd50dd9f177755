#pragma once
// Where ddprun's Python probe is, and whether to load it. The probe (launcher/python in the
// source tree: sitecustomize.py and _ddprun_probe.py) is installed beside ddprun, in
// <prefix>/share/ddprun/python, and ddprun puts that folder first on Python workers'
// PYTHONPATH. A sitecustomize runs in every Python that sees it, so ddprun loads it only from
// its own installation, never from a folder every user may write. Internal to the launcher.

#include <filesystem>
#include <map>
#include <string>

namespace ddp::launcher {

// The variable that turns the probe off: DDPRUN_PYTHON_PROBE=0 (as --skip_python_probe).
inline constexpr const char* kPythonProbeVariable = "DDPRUN_PYTHON_PROBE";

struct PythonProbeDir {
  std::filesystem::path dir;  // empty: do not load the probe
  std::string notice;         // why it is not loaded, when the user should know ("": say nothing)
};

// The probe's folder for this ddprun: <folder of the running program>/../share/ddprun/python,
// unless the probe is turned off (enabled false, or DDPRUN_PYTHON_PROBE=0 in env), missing
// (said in notice), or writable by every user (refused, said in notice).
PythonProbeDir find_python_probe(bool enabled, const std::map<std::string, std::string>& env);

}  // namespace ddp::launcher
