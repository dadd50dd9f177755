// The worker contract is named once: common/include/ddp/common/worker_contract.hpp for C++, and
// its mirror worker/python/_ddprun_contract.py for the Python side (probe, sitecustomize, warm
// template) agree name for name and value for value; and no other source file spells one of
// ddprun's variables as a literal of its own.

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "ddp/common/worker_contract.hpp"
#include "test_support.hpp"

using namespace ddp::test;
namespace fs = std::filesystem;

namespace {

// NAME = "value" lines of the Python mirror.
std::map<std::string, std::string> python_names() {
  std::ifstream in(source_path("worker/python/_ddprun_contract.py"));
  REQUIRE(in.good());
  const std::regex assignment(R"(^([A-Z][A-Z0-9_]*) = "([^"]*)\")");
  std::map<std::string, std::string> names;
  for (std::string line; std::getline(in, line);) {
    std::smatch match;
    if (std::regex_search(line, match, assignment)) names[match[1]] = match[2];
  }
  return names;
}

}  // namespace

TEST_CASE("the Python mirror names every variable and template message as worker_contract.hpp") {
  std::map<std::string, std::string> cpp;
  for (const auto& name : ddp::contract::kDdprunVariables) cpp[name.python] = name.value;
  for (const auto& name : ddp::contract::warm_template::kMessages) {
    REQUIRE_FALSE(cpp.contains(name.python));
    cpp[name.python] = name.value;
  }
  const std::map<std::string, std::string> python = python_names();
  for (const auto& [name, value] : cpp) {
    INFO("C++ " << name << " = " << value);
    REQUIRE(python.contains(name));
    CHECK(python.at(name) == value);
  }
  for (const auto& [name, value] : python) {
    INFO("Python " << name << " = " << value << ": not in worker_contract.hpp");
    CHECK(cpp.contains(name));
  }
}

TEST_CASE("no source of launcher/, runtime/, worker/ or common/ spells a DDPRUN_ variable itself") {
  const std::regex literal(R"re("DDPRUN_[A-Z0-9_]+=?")re");
  const fs::path contract_hpp = "common/include/ddp/common/worker_contract.hpp";
  const fs::path contract_py = "worker/python/_ddprun_contract.py";
  // ddprun.inplace imports nothing of the probe's (it runs under torchrun too): it spells its
  // one variable, and the case below checks that it is the contract's.
  const fs::path package_py = "worker/python_package/ddprun/inplace.py";
  int files = 0;
  for (const char* root : {"launcher", "runtime", "worker", "common"}) {
    for (const auto& entry : fs::recursive_directory_iterator(source_path(root))) {
      const std::string ext = entry.path().extension().string();
      if (ext != ".cpp" && ext != ".hpp" && ext != ".py" && ext != ".h" && ext != ".c") continue;
      const fs::path relative = fs::relative(entry.path(), source_path(""));
      if (relative == contract_hpp || relative == contract_py || relative == package_py) continue;
      ++files;
      const std::string text = read_file(entry.path());
      std::smatch match;
      INFO(relative.string() << " names "
                             << (std::regex_search(text, match, literal) ? match[0].str() : "")
                             << " itself: use worker_contract.hpp / _ddprun_contract.py");
      CHECK_FALSE(std::regex_search(text, literal));
    }
  }
  CHECK(files > 50);
}

TEST_CASE("ddprun.inplace reads the contract's DDPRUN_INPLACE_GENERATION") {
  const std::string text = read_file(source_path("worker/python_package/ddprun/inplace.py"));
  CHECK_THAT(text, Catch::Contains(std::string("GENERATION_VARIABLE = \"") +
                                   ddp::contract::kInplaceGeneration + "\""));
}
