// The run's log directory: fresh per run, as torchrun's mkdtemp(prefix="<run_id>_").
#include "ddp/launcher/log_dir.hpp"

#include <catch2/catch.hpp>
#include <fstream>
#include <regex>

#include "test_support.hpp"

using ddp::launcher::make_run_log_dir;
namespace fs = std::filesystem;

TEST_CASE("each run gets a fresh <log_dir>/<run_id>_<random> directory") {
  ddp::test::TempDir dir;
  const fs::path base = dir.path() / "logs" / "deeper";  // made when missing
  const fs::path first = make_run_log_dir(base, "job7");
  const fs::path second = make_run_log_dir(base, "job7");
  CHECK(first != second);
  for (const fs::path& run : {first, second}) {
    INFO(run);
    CHECK(run.is_absolute());
    CHECK(run.parent_path() == base);
    CHECK(fs::is_directory(run));
    CHECK(fs::is_empty(run));
    CHECK(std::regex_match(run.filename().string(), std::regex("job7_[A-Za-z0-9]{6}")));
  }
}

TEST_CASE("a relative log_dir gives an absolute run directory, and a file in the way an error") {
  ddp::test::TempDir dir;
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  const fs::path run = make_run_log_dir("rel", "none");
  fs::current_path(cwd);
  CHECK(run.is_absolute());
  CHECK(run.parent_path() == dir.path() / "rel");

  std::ofstream(dir.path() / "file") << "x";
  CHECK_THROWS_WITH(make_run_log_dir(dir.path() / "file", "none"),
                    Catch::Contains((dir.path() / "file").string()));
}
