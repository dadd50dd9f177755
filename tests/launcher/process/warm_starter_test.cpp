// WarmStarter's decisions that need no template (issue 36): a template only where a node's
// workers can start again.

#include "process/warm_starter.hpp"

#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>

#include "test_support.hpp"

using namespace ddp::launcher;

TEST_CASE(
    "the workers may start again after a failure with a restart left, or in a job of more than "
    "one node (a membership change), never on one node with --max_restarts=0") {
  const auto [restarts, min_nodes, max_nodes, again] = GENERATE(table<int, int, int, bool>({
      {0, 1, 1, false},  // torchrun's defaults: one round only
      {1, 1, 1, true},   // a failure restarts
      {0, 1, 2, true},   // elastic: a node may arrive
      {0, 2, 2, true},   // a lost node's replacement re-forms the group
  }));
  LaunchConfig config;
  config.max_restarts = restarts;
  config.min_nodes = min_nodes;
  config.max_nodes = max_nodes;
  INFO("--max_restarts=" << restarts << " --nnodes=" << min_nodes << ":" << max_nodes);
  CHECK(workers_may_start_again(config) == again);
}

TEST_CASE(
    "a restart-mode warm starter where the workers start once is off, and no worker is "
    "asked for its modules list") {
  for (const bool later_rounds : {false, true}) {
    boost::asio::io_context io;
    WarmStarterOptions options;
    options.mode = WarmStart::kRestart;
    options.command.python = true;
    options.command.argv = {"python3", "-u", "train.py"};
    options.command.args_begin = 3;
    options.probe_dir = ddp::test::source_path("worker/python");
    options.later_rounds = later_rounds;
    WarmStarter warm(io, options);
    INFO("later rounds: " << later_rounds);
    CHECK(warm.enabled() == later_rounds);
    CHECK(warm.modules_variable("/logs/attempt_0/0").empty() == !later_rounds);
  }
}
