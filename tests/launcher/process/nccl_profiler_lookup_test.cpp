// Where ddprun finds its NCCL profiler plugin, and when it refuses it or leaves it out.
#include "process/nccl_profiler_lookup.hpp"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "skip.hpp"
#include "test_support.hpp"

using namespace ddp::launcher;
namespace fs = std::filesystem;

namespace {

// An installation: <prefix>/bin/ddprun (never run) and <prefix>/lib/<the plugin>.
struct Installation {
  ddp::test::TempDir dir;
  fs::path program = dir.path() / "bin" / "ddprun";
  fs::path plugin = dir.path() / "lib" / "libddprun-nccl-profiler.so";
  Installation() {
    fs::create_directories(program.parent_path());
    fs::create_directories(plugin.parent_path());
    for (const fs::path& p : {dir.path(), plugin.parent_path()}) {
      fs::permissions(p, fs::perms(0755));
    }
    std::ofstream(plugin) << "not really a library";
    fs::permissions(plugin, fs::perms(0644));
  }
};

}  // namespace

TEST_CASE("nccl profiler lookup: the plugin in the lib dir beside ddprun") {
  Installation install;
  const NcclProfilerPlugin found = find_nccl_profiler(install.program, {}, ::geteuid());
  CHECK(found.path == install.plugin);
  CHECK(found.notice.empty());
}

TEST_CASE("nccl profiler lookup: a plugin every user may write is refused, with a notice") {
  Installation install;
  SECTION("the file") {
    fs::permissions(install.plugin, fs::perms::others_write, fs::perm_options::add);
  }
  SECTION("its folder") {
    fs::permissions(install.plugin.parent_path(), fs::perms::others_write, fs::perm_options::add);
  }
  const NcclProfilerPlugin found = find_nccl_profiler(install.program, {}, ::geteuid());
  CHECK(found.path.empty());
  CHECK(found.notice.find("writable by every user") != std::string::npos);
  CHECK(found.notice.find("chmod o-w") != std::string::npos);
}

TEST_CASE(
    "nccl profiler lookup: a plugin another user could change is refused: a group-writable "
    "folder on the way, or a file owned by another user") {
  Installation install;
  fs::path at_fault;
  SECTION("a group-writable folder above it") {
    at_fault = install.dir.path();
    fs::permissions(at_fault, fs::perms::group_write, fs::perm_options::add);
  }
  SECTION("the file owned by another user") {
    if (::geteuid() != 0) return ddp::test::skip("chown to another user needs root");
    at_fault = install.plugin;
    REQUIRE(::chown(at_fault.c_str(), 4242, static_cast<gid_t>(-1)) == 0);
  }
  const NcclProfilerPlugin found = find_nccl_profiler(install.program, {}, ::geteuid());
  CHECK(found.path.empty());
  CHECK_THAT(
      found.notice,
      Catch::StartsWith("ddprun: the NCCL profiler plugin is off: " + at_fault.string() + " is "));
  CHECK_THAT(found.notice, Catch::Contains("NCCL would load into every worker"));
}

TEST_CASE(
    "nccl profiler lookup: the user's NCCL_PROFILER_PLUGIN or DDPRUN_NCCL_PROFILER=0 "
    "leaves it out, silently") {
  Installation install;
  for (const auto& env :
       std::vector<std::map<std::string, std::string>>{{{"NCCL_PROFILER_PLUGIN", "/opt/theirs.so"}},
                                                       {{"NCCL_PROFILER_PLUGIN", "none"}},
                                                       {{"DDPRUN_NCCL_PROFILER", "0"}}}) {
    const NcclProfilerPlugin found = find_nccl_profiler(install.program, env, ::geteuid());
    CHECK(found.path.empty());
    CHECK(found.notice.empty());
  }
}

TEST_CASE("nccl profiler lookup: a missing plugin is said once") {
  Installation install;
  fs::remove(install.plugin);
  const NcclProfilerPlugin found = find_nccl_profiler(install.program, {}, ::geteuid());
  CHECK(found.path.empty());
  CHECK(found.notice.find("is missing") != std::string::npos);
}

// Issue 28: with NCCL_PROFILER_PLUGIN unset NCCL loads libnccl-profiler.so, or a profiler the
// net plugin exports; ddprun naming its own silently displaced the user's.
TEST_CASE("nccl profiler lookup: a profiler NCCL would load without the variable is left alone") {
  Installation install;
  ddp::test::TempDir libs;
  const std::string search = libs.path().string();
  SECTION("a libnccl-profiler.so on LD_LIBRARY_PATH") {
    std::ofstream(libs.path() / "libnccl-profiler.so") << "a profiler";
    const auto found = find_nccl_profiler(install.program,
                                          {{"LD_LIBRARY_PATH", "/nowhere:" + search}}, ::geteuid());
    CHECK(found.path.empty());
    CHECK_THAT(found.notice, Catch::Contains((libs.path() / "libnccl-profiler.so").string()) &&
                                 Catch::Contains("leaves NCCL_PROFILER_PLUGIN unset"));
  }
  SECTION("a net plugin (NCCL_NET_PLUGIN) that exports ncclProfiler_v5") {
    std::ofstream(libs.path() / "libnccl-net-ofi.so") << "...ncclNet_v9...ncclProfiler_v5...";
    const auto found = find_nccl_profiler(
        install.program, {{"LD_LIBRARY_PATH", search}, {"NCCL_NET_PLUGIN", "ofi"}}, ::geteuid());
    CHECK(found.path.empty());
    CHECK_THAT(found.notice, Catch::Contains("libnccl-net-ofi.so"));
  }
  SECTION("a net plugin without a profiler does not count") {
    std::ofstream(libs.path() / "libnccl-net.so") << "...ncclNet_v9...";
    const auto found =
        find_nccl_profiler(install.program, {{"LD_LIBRARY_PATH", search}}, ::geteuid());
    CHECK(found.path == install.plugin);
    CHECK(found.notice.empty());
  }
}
