// The installed package: a user project builds the sample program with find_package(ddp)
// (and with pkg-config), and it prints sum=3 on 3 ranks under ddprun.
#include <catch2/catch.hpp>
#include <fstream>
#include <regex>

#include "test_support.hpp"

namespace {

ddp::test::ShellResult run(const std::string& command) {
  return ddp::test::run_shell(command, 300);
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

}  // namespace

TEST_CASE("the sample program builds against the installed package and prints sum=3") {
  ddp::test::TempDir dir;
  const auto prefix = dir.path() / "prefix";
  const auto build_dir = ddp::test::bin_path("").parent_path().parent_path();  // build/
  auto result = run("cmake --install " + build_dir.string() + " --prefix " + prefix.string());
  INFO(result.output);
  REQUIRE(result.status == 0);
  REQUIRE(std::filesystem::exists(prefix / "include/ddp/runtime.hpp"));

  const auto project = dir.path() / "user";
  std::filesystem::create_directories(project);
  std::filesystem::copy_file(ddp::test::source_path("apps/examples/sum.cpp"), project / "main.cpp");
  write_file(project / "CMakeLists.txt",
             "cmake_minimum_required(VERSION 3.20)\n"
             "project(user CXX)\n"
             "set(CMAKE_CXX_STANDARD 20)\n"
             "find_package(ddp REQUIRED)\n"
             "add_executable(sum main.cpp)\n"
             "target_link_libraries(sum PRIVATE ddp::runtime)\n");
  result = run("cmake -S " + project.string() + " -B " + (project / "build").string() +
               " -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=" + prefix.string() +
               " && cmake --build " + (project / "build").string());
  INFO(result.output);
  REQUIRE(result.status == 0);

  result = run(ddp::test::bin_path("ddprun").string() + " --nproc_per_node=3 " +
               (project / "build" / "sum").string());
  INFO(result.output);
  REQUIRE(result.status == 0);
  const std::regex line("rank=[012] world=3 sum=3\\b");
  REQUIRE(std::distance(std::sregex_iterator(result.output.begin(), result.output.end(), line),
                        std::sregex_iterator()) == 3);

  // pkg-config: the relocated .pc file is enough to compile and link the same program.
  result = run("sh -c 'c++ -std=c++20 " + (project / "main.cpp").string() + " -o " +
               (project / "sum_pc").string() + " $(env PKG_CONFIG_PATH=" +
               (prefix / "lib/pkgconfig").string() + " pkg-config --cflags --libs ddp)'");
  INFO(result.output);
  REQUIRE(result.status == 0);
  REQUIRE(std::filesystem::exists(project / "sum_pc"));
}
