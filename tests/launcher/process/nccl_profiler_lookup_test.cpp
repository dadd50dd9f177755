// Where ddprun finds its NCCL profiler plugin, and when it refuses it or leaves it out.
#include "process/nccl_profiler_lookup.hpp"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

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
    fs::permissions(plugin.parent_path(), fs::perms::others_write, fs::perm_options::remove);
    std::ofstream(plugin) << "not really a library";
    fs::permissions(plugin, fs::perms::others_write, fs::perm_options::remove);
  }
};

}  // namespace

TEST_CASE("nccl profiler lookup: the plugin in the lib dir beside ddprun") {
  Installation install;
  const NcclProfilerPlugin found = find_nccl_profiler(install.program, {});
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
  const NcclProfilerPlugin found = find_nccl_profiler(install.program, {});
  CHECK(found.path.empty());
  CHECK(found.notice.find("writable by every user") != std::string::npos);
  CHECK(found.notice.find("chmod o-w") != std::string::npos);
}

TEST_CASE(
    "nccl profiler lookup: the user's NCCL_PROFILER_PLUGIN or DDPRUN_NCCL_PROFILER=0 "
    "leaves it out, silently") {
  Installation install;
  for (const auto& env :
       std::vector<std::map<std::string, std::string>>{{{"NCCL_PROFILER_PLUGIN", "/opt/theirs.so"}},
                                                       {{"NCCL_PROFILER_PLUGIN", "none"}},
                                                       {{"DDPRUN_NCCL_PROFILER", "0"}}}) {
    const NcclProfilerPlugin found = find_nccl_profiler(install.program, env);
    CHECK(found.path.empty());
    CHECK(found.notice.empty());
  }
}

TEST_CASE("nccl profiler lookup: a missing plugin is said once") {
  Installation install;
  fs::remove(install.plugin);
  const NcclProfilerPlugin found = find_nccl_profiler(install.program, {});
  CHECK(found.path.empty());
  CHECK(found.notice.find("is missing") != std::string::npos);
}
