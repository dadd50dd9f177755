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
             "target_link_libraries(sum PRIVATE ddp::runtime)\n"
             // The rendezvous rooms, by their old combined target and by the store alone.
             "add_executable(rdzv rdzv.cpp)\n"
             "target_link_libraries(rdzv PRIVATE ddp::rendezvous)\n"
             "add_executable(store_only store_only.cpp)\n"
             "target_link_libraries(store_only PRIVATE ddp::store)\n");
  write_file(project / "rdzv.cpp",
             "#include \"ddp/elastic/round_state.hpp\"\n"
             "#include \"ddp/etcd/etcd_store.hpp\"\n"
             "#include \"ddp/store/local_address.hpp\"\n"
             "#include \"ddp/store/memory_store.hpp\"\n"
             "int main() {\n"
             "  ddp::store::MemoryStore store;\n"
             "  store.set(\"k\", \"v\");\n"
             "  return store.get(\"k\") == \"v\" &&\n"
             "         !ddp::store::local_address_towards(\"127.0.0.1\", 1).empty() ? 0 : 1;\n"
             "}\n");
  write_file(project / "store_only.cpp",
             "#include \"ddp/store/memory_store.hpp\"\n"
             "int main() {\n"
             "  ddp::store::MemoryStore store;\n"
             "  return store.add(\"n\", 2) == 2 ? 0 : 1;\n"
             "}\n");
  result = run("cmake -S " + project.string() + " -B " + (project / "build").string() +
               " -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=" + prefix.string() +
               " && cmake --build " + (project / "build").string());
  INFO(result.output);
  REQUIRE(result.status == 0);

  result = run((project / "build" / "rdzv").string() + " && " +
               (project / "build" / "store_only").string());
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
