// ddprun: a torchrun-compatible launcher. Parses the command line into a LaunchConfig and
// hands it to the agent; this file only picks exit codes.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "ddp/launcher/agent.hpp"
#include "ddp/launcher/cli.hpp"
#include "ddp/launcher/worker_env.hpp"

int main(int argc, char** argv) {
  using namespace ddp::launcher;
  std::signal(SIGPIPE, SIG_IGN);  // a closed console must not kill the agent; workers reset it
  try {
    const CliContext context = process_cli_context();
    CliResult cli = parse_command_line(std::vector<std::string>(argv + 1, argv + argc), context);
    if (cli.action != CliResult::Action::kRun) {
      std::fputs(cli.text.c_str(), stdout);
      return 0;
    }
    auto getenv = [](const std::string& name) -> std::optional<std::string> {
      const char* value = std::getenv(name.c_str());
      return value ? std::optional<std::string>(value) : std::nullopt;
    };
    WorkerCommand command = resolve_worker_command(cli.config, getenv);
    AgentOptions options;
    options.base_env = current_environment();
    Agent agent(std::move(cli.config), std::move(command), std::move(options));
    return agent.run();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "ddprun: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun: %s\n", e.what());
    return 1;
  }
}
