// Where ddprun finds its Python probe, when it refuses it (a path another user could change:
// a group-writable shared prefix, a .pyc planted in __pycache__), and how it puts the probe on
// PYTHONPATH so that the worker can restore the user's value exactly.
#include "process/python_probe.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "skip.hpp"
#include "test_support.hpp"

using namespace ddp::launcher;
namespace fs = std::filesystem;

namespace {

// An installation: <prefix>/bin/ddprun (never run), <prefix>/share/ddprun/python/*.py, every
// folder writable by its owner only; <prefix> is <temp>/shared/prefix.
struct Installation {
  ddp::test::TempDir dir;
  fs::path shared = dir.path() / "shared";
  fs::path prefix = shared / "prefix";
  fs::path program = prefix / "bin" / "ddprun";
  fs::path probe = prefix / "share" / "ddprun" / "python";
  Installation() {
    fs::create_directories(program.parent_path());
    fs::create_directories(probe);
    for (const char* name : {"sitecustomize.py", "_ddprun_probe.py"}) {
      std::ofstream(probe / name) << "# code\n";
      fs::permissions(probe / name, fs::perms(0644));
    }
    for (fs::path p = probe; p != dir.path().parent_path(); p = p.parent_path()) {
      fs::permissions(p, fs::perms(0755));
    }
    fs::permissions(program.parent_path(), fs::perms(0755));
  }
  PythonProbeDir find(uid_t user = ::geteuid()) const {
    return find_python_probe(program, true, {}, user);
  }
};

std::string entry(const std::vector<std::string>& env, const std::string& name) {
  for (const std::string& e : env) {
    if (e.starts_with(name + "=")) return e.substr(name.size() + 1);
  }
  return "<unset>";
}

}  // namespace

TEST_CASE("python probe: found beside ddprun, its __pycache__ made writable by its owner only") {
  Installation install;
  const ::mode_t old_mask = ::umask(002);  // a umask that would make __pycache__ group-writable
  const PythonProbeDir found = install.find();
  ::umask(old_mask);
  CHECK(found.dir == fs::canonical(install.probe));
  CHECK(found.notice.empty());
  struct stat info {};
  REQUIRE(::stat((install.probe / "__pycache__").c_str(), &info) == 0);
  CHECK((info.st_mode & 07777) == 0755);
}

TEST_CASE("python probe: off, or missing") {
  Installation install;
  CHECK(find_python_probe(install.program, false, {}, ::geteuid()).dir.empty());
  const PythonProbeDir off =
      find_python_probe(install.program, true, {{"DDPRUN_PYTHON_PROBE", "0"}}, ::geteuid());
  CHECK(off.dir.empty());
  CHECK(off.notice.empty());
  fs::remove(install.probe / "sitecustomize.py");
  CHECK_THAT(install.find().notice, Catch::Contains("is missing"));
}

TEST_CASE("python probe: a group-writable folder above it (a shared project folder) is refused") {
  Installation install;
  fs::permissions(install.shared, fs::perms::group_write, fs::perm_options::add);
  struct stat info {};
  REQUIRE(::stat(install.shared.c_str(), &info) == 0);
  const PythonProbeDir found = install.find();
  CHECK(found.dir.empty());
  CHECK(found.notice == "ddprun: the Python probe is off: " + install.shared.string() +
                            " is writable by its group (gid " + std::to_string(info.st_gid) +
                            "), so another user could put code there that would run in every "
                            "worker; make it writable by its owner only (chmod g-w " +
                            install.shared.string() +
                            "), or install ddprun where only root can write");
}

TEST_CASE("python probe: a file in it writable by every user is refused") {
  Installation install;
  fs::permissions(install.probe / "_ddprun_probe.py", fs::perms::others_write,
                  fs::perm_options::add);
  const PythonProbeDir found = install.find();
  CHECK(found.dir.empty());
  CHECK_THAT(found.notice, Catch::Contains((install.probe / "_ddprun_probe.py").string() +
                                           " is writable by every user"));
}

TEST_CASE("python probe: byte-code another user planted in __pycache__ is refused") {
  if (::geteuid() != 0) return ddp::test::skip("chown to another user needs root");
  Installation install;
  REQUIRE(install.find().notice.empty());  // makes __pycache__
  const fs::path pyc = install.probe / "__pycache__" / "sitecustomize.cpython-311.pyc";
  std::ofstream(pyc) << "planted";
  fs::permissions(pyc, fs::perms(0644));
  REQUIRE(::chown(pyc.c_str(), 4242, static_cast<gid_t>(-1)) == 0);
  const PythonProbeDir found = install.find();
  CHECK(found.dir.empty());
  CHECK_THAT(found.notice, Catch::Contains(pyc.string() + " is owned by uid 4242"));
}

TEST_CASE("python probe: an installation owned by another user is refused, trusted by that user") {
  if (::geteuid() != 0) return ddp::test::skip("chown to another user needs root");
  Installation install;
  REQUIRE(::chown(install.prefix.c_str(), 4242, static_cast<gid_t>(-1)) == 0);
  CHECK_THAT(install.find().notice, Catch::Contains(install.prefix.string() + " is owned by uid "
                                                                              "4242"));
  CHECK(install.find(4242).dir == fs::canonical(install.probe));
}

TEST_CASE("python probe: with PYTHONPYCACHEPREFIX, the byte-code folder there is checked too") {
  Installation install;
  const fs::path cache = install.dir.path() / "cache";
  fs::create_directory(cache);
  fs::permissions(cache, fs::perms(0755));
  auto find = [&] {
    return find_python_probe(install.program, true, {{"PYTHONPYCACHEPREFIX", cache.string()}},
                             ::geteuid());
  };
  CHECK(find().notice.empty());  // its byte-code folder not made yet: made by Python, for us
  const fs::path bytecode = cache / fs::canonical(install.probe).relative_path();
  fs::create_directories(bytecode);
  CHECK(find().notice.empty());
  SECTION("a group-writable cache folder") {
    fs::permissions(cache, fs::perms::group_write, fs::perm_options::add);
    CHECK_THAT(find().notice, Catch::Contains(cache.string() + " is writable by its group"));
  }
  SECTION("byte-code writable by every user in the probe's folder there") {
    std::ofstream(bytecode / "sitecustomize.cpython-311.pyc") << "planted";
    fs::permissions(bytecode / "sitecustomize.cpython-311.pyc", fs::perms(0666));
    CHECK_THAT(find().notice,
               Catch::Contains("sitecustomize.cpython-311.pyc is writable by every"));
  }
  SECTION("a missing cache under a folder every user may write") {
    fs::remove_all(cache);
    fs::permissions(install.dir.path(), fs::perms(0777));
    CHECK_THAT(find().notice, Catch::Contains(install.dir.path().string() + " is writable by "
                                                                            "every user"));
  }
}

TEST_CASE("python probe: PYTHONPATH gets the probe first, and the user's value is kept exactly") {
  const fs::path dir = "/opt/ddprun/share/ddprun/python";
  SECTION("unset stays told apart from empty: no DDPRUN_PYTHONPATH") {
    std::vector<std::string> env = {"HOME=/root", "DDPRUN_PYTHONPATH=stale from an outer ddprun"};
    add_python_probe_path(env, dir);
    CHECK(entry(env, "PYTHONPATH") == dir.string());
    CHECK(entry(env, "DDPRUN_PYTHONPATH") == "<unset>");
  }
  for (const std::string value : {"", ":", "a:b", "/x::"}) {
    SECTION("PYTHONPATH=\"" + value + "\"") {
      std::vector<std::string> env = {"PYTHONPATH=" + value};
      add_python_probe_path(env, dir);
      // An empty value gets no ":" after the probe: a trailing empty entry is the current folder.
      CHECK(entry(env, "PYTHONPATH") ==
            (value.empty() ? dir.string() : dir.string() + ":" + value));
      CHECK(entry(env, "DDPRUN_PYTHONPATH") == value);
      CHECK(env.size() == 2);
    }
  }
}
