// Slurm's host lists and SLURM_* defaults, in-process with a fake environment. The real
// srun path is tests/launcher/cli/slurm/run_slurm_test.sh.
#include "ddp/launcher/slurm_env.hpp"

#include <catch2/catch.hpp>
#include <map>

using namespace ddp::launcher;
using Hosts = std::vector<std::string>;

namespace {

// A lookup over a fixed map, as the CLI's getenv.
std::function<std::optional<std::string>(const std::string&)> env_of(
    std::map<std::string, std::string> env) {
  return [env = std::move(env)](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

// The message expand_nodelist throws for `list`.
std::string nodelist_error(const std::string& list) {
  try {
    expand_nodelist(list);
  } catch (const SlurmEnvError& e) {
    return e.what();
  }
  FAIL("expand_nodelist(\"" << list << "\") did not throw");
  return "";
}

}  // namespace

TEST_CASE("expand_nodelist: plain names and single hosts") {
  CHECK(expand_nodelist("node1") == Hosts{"node1"});
  CHECK(expand_nodelist("a,b,c") == Hosts{"a", "b", "c"});
  CHECK(expand_nodelist("n-1.example.com,10.0.0.2") == Hosts{"n-1.example.com", "10.0.0.2"});
  CHECK(expand_nodelist("c,a,b") == Hosts{"c", "a", "b"});  // the order written, not sorted
}

TEST_CASE("expand_nodelist: issue 7's example, padding kept, groups in order") {
  CHECK(expand_nodelist("gpu[01-04,07],cpu-a[1-2]") ==
        Hosts{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu-a1", "cpu-a2"});
}

TEST_CASE("expand_nodelist: ranges and widths") {
  CHECK(expand_nodelist("n[1-3]") == Hosts{"n1", "n2", "n3"});
  CHECK(expand_nodelist("n[8-11]") == Hosts{"n8", "n9", "n10", "n11"});
  CHECK(expand_nodelist("n[08-11]") == Hosts{"n08", "n09", "n10", "n11"});
  CHECK(expand_nodelist("n[098-101]") == Hosts{"n098", "n099", "n100", "n101"});
  CHECK(expand_nodelist("n[5]") == Hosts{"n5"});
  CHECK(expand_nodelist("n[007]") == Hosts{"n007"});
  CHECK(expand_nodelist("n[3-3]") == Hosts{"n3"});
  CHECK(expand_nodelist("n[0]") == Hosts{"n0"});
  CHECK(expand_nodelist("n[1,3,5-6]") == Hosts{"n1", "n3", "n5", "n6"});
  CHECK(expand_nodelist("n[3,1]") == Hosts{"n3", "n1"});
}

TEST_CASE("expand_nodelist: brackets anywhere, several per name as a product") {
  CHECK(expand_nodelist("[1-2]") == Hosts{"1", "2"});
  CHECK(expand_nodelist("[1-2]x") == Hosts{"1x", "2x"});
  CHECK(expand_nodelist("rack[1-2]-n[01-02]") ==
        Hosts{"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"});
  CHECK(expand_nodelist("a[1-2],b,c[3]") == Hosts{"a1", "a2", "b", "c3"});
  CHECK(expand_nodelist("10.0.0.[1-2]") == Hosts{"10.0.0.1", "10.0.0.2"});
}

TEST_CASE("expand_nodelist: a large range") {
  auto hosts = expand_nodelist("n[0000-9999]");
  REQUIRE(hosts.size() == 10000);
  CHECK(hosts.front() == "n0000");
  CHECK(hosts[42] == "n0042");
  CHECK(hosts.back() == "n9999");
}

TEST_CASE("expand_nodelist: malformed lists fail naming the list and the place") {
  CHECK(nodelist_error("") == "bad Slurm node list \"\": empty list at character 1");
  CHECK(nodelist_error("gpu[01-") ==
        "bad Slurm node list \"gpu[01-\": unclosed '[' at character 4");
  CHECK(nodelist_error("gpu01]") ==
        "bad Slurm node list \"gpu01]\": ']' without '[' at character 6");
  CHECK(nodelist_error("a,,b") == "bad Slurm node list \"a,,b\": empty host name at character 3");
  CHECK(nodelist_error("n[4-2]") ==
        "bad Slurm node list \"n[4-2]\": range \"4-2\" ends below its start at character 3");
  CHECK(nodelist_error("n[a-2]") ==
        "bad Slurm node list \"n[a-2]\": range bound \"a\" is not a number at character 3");
  CHECK(nodelist_error("n[1-x]") ==
        "bad Slurm node list \"n[1-x]\": range bound \"x\" is not a number at character 5");
  CHECK(nodelist_error("n[1 2]") == "bad Slurm node list \"n[1 2]\": whitespace at character 4");
}

TEST_CASE("expand_nodelist: every kind of malformed input is refused") {
  const char* bad[] = {
      ",",      "a,",    ",a",    "a[",     "a]",       "a[]",     "a[,]",
      "a[1,]",  "a[,1]", "a[-1]", "a[1-]",  "a[1-2-3]", "a[+1]",   "a[1[2]]",
      "a[[1]]", "a[1]]", "a[1-2", "a[1],[", "a b",      " a",      "a\tb",
      "a\n",    "n[1,2", "n]1[",  "a[0x1]", "a[1.5]",   "a[1--2]", "a[9999999999999999999]",
  };
  for (const char* list : bad) {
    INFO("list: \"" << list << "\"");
    CHECK_THROWS_AS(expand_nodelist(list), SlurmEnvError);
  }
}

TEST_CASE("expand_nodelist: refuses lists that would expand past the limit") {
  CHECK_THROWS_WITH(expand_nodelist("n[0-999999999]"), Catch::Contains("more than 1000000 hosts"));
  CHECK_THROWS_WITH(expand_nodelist("a[0-999]b[0-999]c[0-9]"), Catch::Contains("more than"));
  CHECK_THROWS_WITH(expand_nodelist("a[0-999999],b[0-1]"), Catch::Contains("more than"));
  CHECK(expand_nodelist("n[1-999999]").size() == 999999);
}

TEST_CASE("slurm_defaults: nothing outside a Slurm job") {
  CHECK_FALSE(slurm_defaults(env_of({})).has_value());
  CHECK_FALSE(slurm_defaults(env_of({{"SLURM_NNODES", "2"}, {"SLURM_NODEID", "1"}})).has_value());
  CHECK_FALSE(slurm_defaults(env_of({{"SLURM_JOB_ID", ""}})).has_value());
}

TEST_CASE("slurm_defaults: srun's variables become options, with one line saying so") {
  auto defaults = slurm_defaults(env_of({{"SLURM_JOB_ID", "42"},
                                         {"SLURM_NNODES", "2"},
                                         {"SLURM_NODEID", "1"},
                                         {"SLURM_JOB_NODELIST", "node[1-2]"}}));
  REQUIRE(defaults.has_value());
  CHECK(defaults->job_id == "42");
  CHECK(defaults->options() ==
        std::vector<SlurmOption>{{"nnodes", "2", "SLURM_NNODES"},
                                 {"node_rank", "1", "SLURM_NODEID"},
                                 {"master_addr", "node1", "SLURM_JOB_NODELIST"},
                                 {"rdzv_id", "42", "SLURM_JOB_ID"}});
  CHECK(defaults->summary() ==
        "ddprun: from Slurm job 42: --nnodes=2 --node_rank=1 --master_addr=node1 --rdzv_id=42");
}

TEST_CASE("slurm_defaults: the fallback variables") {
  auto defaults = slurm_defaults(env_of({{"SLURM_JOB_ID", "7"},
                                         {"SLURM_JOB_NUM_NODES", "3"},
                                         {"SLURM_NODEID", "0"},
                                         {"SLURM_NODELIST", "gpu[07-09]"}}));
  REQUIRE(defaults.has_value());
  REQUIRE(defaults->nnodes.has_value());
  CHECK(*defaults->nnodes == SlurmOption{"nnodes", "3", "SLURM_JOB_NUM_NODES"});
  REQUIRE(defaults->master_addr.has_value());
  CHECK(*defaults->master_addr == SlurmOption{"master_addr", "gpu07", "SLURM_NODELIST"});
}

TEST_CASE("slurm_defaults: SLURM_NNODES and SLURM_JOB_NODELIST win over their fallbacks") {
  auto defaults = slurm_defaults(env_of({{"SLURM_JOB_ID", "7"},
                                         {"SLURM_NNODES", "2"},
                                         {"SLURM_JOB_NUM_NODES", "4"},
                                         {"SLURM_JOB_NODELIST", "a,b"},
                                         {"SLURM_NODELIST", "c,d"}}));
  REQUIRE(defaults.has_value());
  CHECK(defaults->nnodes->value == "2");
  CHECK(defaults->master_addr->value == "a");
}

TEST_CASE("slurm_defaults: only the variables Slurm set give values") {
  auto defaults = slurm_defaults(env_of({{"SLURM_JOB_ID", "9"}}));
  REQUIRE(defaults.has_value());
  CHECK_FALSE(defaults->nnodes.has_value());
  CHECK_FALSE(defaults->node_rank.has_value());
  CHECK_FALSE(defaults->master_addr.has_value());
  CHECK(defaults->summary() == "ddprun: from Slurm job 9: --rdzv_id=9");
}

TEST_CASE("slurm_defaults: options the user gave win, and leave the line") {
  auto defaults = slurm_defaults(env_of({{"SLURM_JOB_ID", "42"},
                                         {"SLURM_NNODES", "2"},
                                         {"SLURM_NODEID", "1"},
                                         {"SLURM_JOB_NODELIST", "node[1-2]"}}));
  REQUIRE(defaults.has_value());
  auto kept = defaults->without(
      [](std::string_view dest) { return dest == "master_addr" || dest == "rdzv_id"; });
  CHECK(kept.summary() == "ddprun: from Slurm job 42: --nnodes=2 --node_rank=1");
  auto none = defaults->without([](std::string_view) { return true; });
  CHECK(none.options().empty());
  CHECK(none.summary().empty());
}

TEST_CASE("slurm_defaults: malformed variables fail naming the variable") {
  auto error = [](std::map<std::string, std::string> env) -> std::string {
    env.emplace("SLURM_JOB_ID", "5");
    try {
      slurm_defaults(env_of(env));
    } catch (const SlurmEnvError& e) {
      return e.what();
    }
    return "(no error)";
  };
  CHECK_THAT(error({{"SLURM_NNODES", "two"}}),
             Catch::StartsWith("SLURM_NNODES=two: expected a whole number"));
  CHECK_THAT(error({{"SLURM_NNODES", "0"}}),
             Catch::StartsWith("SLURM_NNODES=0: expected a whole number of at least 1"));
  CHECK_THAT(error({{"SLURM_JOB_NUM_NODES", "2x"}}), Catch::StartsWith("SLURM_JOB_NUM_NODES=2x"));
  CHECK_THAT(error({{"SLURM_NODEID", "-1"}}),
             Catch::StartsWith("SLURM_NODEID=-1: expected a whole number of at least 0"));
  CHECK_THAT(error({{"SLURM_NNODES", "2"}, {"SLURM_NODEID", "2"}}),
             Catch::StartsWith("SLURM_NODEID=2 is not below SLURM_NNODES=2"));
  CHECK_THAT(error({{"SLURM_JOB_NODELIST", "n[1-"}}),
             Catch::StartsWith("SLURM_JOB_NODELIST: bad Slurm node list \"n[1-\": unclosed '['"));
}

TEST_CASE("slurm_defaults: inside an srun step the step's node count and list come first") {
  // `srun -N1 -w b` in a two-node allocation: what Slurm 22.05 sets.
  auto defaults = slurm_defaults(env_of({{"SLURM_JOB_ID", "3"},
                                         {"SLURM_JOB_NUM_NODES", "2"},
                                         {"SLURM_NNODES", "1"},
                                         {"SLURM_STEP_NUM_NODES", "1"},
                                         {"SLURM_NODEID", "0"},
                                         {"SLURM_JOB_NODELIST", "a,b"},
                                         {"SLURM_NODELIST", "a,b"},
                                         {"SLURM_STEP_NODELIST", "b"},
                                         {"SLURM_STEP_ID", "0"}}));
  REQUIRE(defaults.has_value());
  CHECK(defaults->in_step);
  CHECK(*defaults->nnodes == SlurmOption{"nnodes", "1", "SLURM_STEP_NUM_NODES"});
  CHECK(*defaults->master_addr == SlurmOption{"master_addr", "b", "SLURM_STEP_NODELIST"});
}

TEST_CASE("check_started_by_srun: several nodes outside an srun step are refused") {
  // The batch script of a two-node job, before any srun: what Slurm 22.05 sets.
  std::map<std::string, std::string> batch = {{"SLURM_JOB_ID", "4"},
                                              {"SLURM_JOB_NUM_NODES", "2"},
                                              {"SLURM_NNODES", "2"},
                                              {"SLURM_NODEID", "0"},
                                              {"SLURM_JOB_NODELIST", "a,b"}};
  auto defaults = slurm_defaults(env_of(batch));
  REQUIRE(defaults.has_value());
  CHECK_FALSE(defaults->in_step);
  CHECK_THROWS_WITH(defaults->check_started_by_srun(),
                    Catch::StartsWith("SLURM_NNODES=2 but ddprun was not started by srun") &&
                        Catch::Contains("srun --ntasks-per-node=1 ddprun"));
  // --nnodes given: nothing of the allocation's size is taken.
  auto given = defaults->without([](std::string_view dest) { return dest == "nnodes"; });
  CHECK_NOTHROW(given.check_started_by_srun());
  // In a step, or with one node, it is fine.
  auto stepped = batch;
  stepped.emplace("SLURM_STEPID", "0");
  CHECK_NOTHROW(slurm_defaults(env_of(stepped))->check_started_by_srun());
  auto single = batch;
  single["SLURM_NNODES"] = std::string("1");
  CHECK_NOTHROW(slurm_defaults(env_of(single))->check_started_by_srun());
}
