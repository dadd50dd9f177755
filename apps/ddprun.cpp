// ddprun: a torchrun-compatible launcher. Parses the command line into a LaunchConfig and
// hands it to the agent; this file only picks exit codes (torchrun's: usage_error.hpp).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "ddp/launcher/agent.hpp"
#include "ddp/launcher/cli.hpp"
#include "ddp/launcher/process_setup.hpp"
#include "ddp/launcher/worker_env.hpp"

int main(int argc, char** argv) {
  using namespace ddp::launcher;
  // Before anything opens a descriptor: closed standard streams become /dev/null.
  if (!open_missing_standard_descriptors()) return 1;
  std::signal(SIGPIPE, SIG_IGN);  // a closed console must not kill the agent; workers reset it
  raise_open_file_limit();
  LaunchConfig job;  // for the message when descriptors run out
  try {
    const CliContext context = process_cli_context();
    CliResult cli = parse_command_line(std::vector<std::string>(argv + 1, argv + argc), context);
    if (cli.action != CliResult::Action::kRun) {
      std::fputs(cli.text.c_str(), stdout);
      return 0;
    }
    for (const std::string& line : cli.notices) std::fprintf(stderr, "%s\n", line.c_str());
    WorkerCommand command = resolve_worker_command(cli.config, context.getenv);
    job = cli.config;
    AgentOptions options;
    options.base_env = current_environment();
    Agent agent(std::move(cli.config), std::move(command), std::move(options));
    return agent.run();
  } catch (const CommandLineError& e) {  // where torchrun's argparse stops: 2
    std::fprintf(stderr, "ddprun: error: %s\n", e.what());
    return 2;
  } catch (const UsageError& e) {  // a value torchrun refuses once parsed: 1
    std::fprintf(stderr, "ddprun: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    if (is_out_of_descriptors(e)) {
      std::fprintf(stderr, "ddprun: %s\n", out_of_descriptors_message(job, e).c_str());
    } else {
      std::fprintf(stderr, "ddprun: %s\n", e.what());
    }
    return 1;
  }
}
