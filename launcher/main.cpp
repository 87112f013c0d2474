// mcprun: a subcommand (jobs, status, stop, topo, store, doctor, hostnames), or torchrun's flags
// and a Launch.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "common/exit_status.hpp"
#include "common/logging.hpp"
#include "common/sys.hpp"
#include "common/topology.hpp"
#include "launcher/commands/doctor.hpp"
#include "launcher/commands/operator_command.hpp"
#include "launcher/commands/store_command.hpp"
#include "launcher/config/launch_config.hpp"
#include "launcher/config/slurm.hpp"
#include "launcher/launch.hpp"
#include "launcher/process/process_control.hpp"
#include "launcher/report/run_summary.hpp"

namespace mcprun {
namespace {

int show_topology() {
  std::vector<GpuDevice> gpus = discover_gpus();
  annotate_with_driver_uuids(gpus);
  std::optional<std::string> allowed;
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) allowed = visible;
  std::cout << format_topology(gpus, topology_order(gpus, allowed));
  return kExitSuccess;
}

/// A launch from torchrun's flags: parsed, run, its summaries written; mcprun's exit code.
int run_launch(const std::vector<std::string>& args) {
  auto parsed = parse_launch_config(args);
  if (!parsed) return usage_error(parsed.error().message);
  if (auto* info = std::get_if<InfoRequest>(&*parsed)) {
    std::cout << info->text;
    return kExitSuccess;
  }
  const LaunchConfig& config = std::get<LaunchConfig>(*parsed);
  init_logging("mcprun", config.verbose);
  for (const auto& note : config.notes) spdlog::info("{}", note);
  RunSummary summary(config, host_name());
  if (auto writable = summary.check_writable(); !writable)
    return usage_error(writable.error().message);
  // Scoped to the launch: its end tells the group guardian that the launcher ended cleanly.
  PosixProcessControl control;
  Launch launch(config, summary, control);
  const int code = launch.run();
  // Every ending of the launch, for CI; written before the teardown, so that a SIGKILL soon
  // after the workers are stopped (Slurm's, KillWait after its SIGTERM) cannot lose it.
  summary.write(code);
  return code;
}

/// `mcprun doctor --collectives [-n N] [launch flags]`: the preflight with nothing after it
/// (`true` runs where a script would); 0 when it passed, 1 when it named a fault, as the
/// doctor's other checks say.
int run_collectives_check(std::vector<std::string> args) {
  std::erase(args, "--collectives");
  for (const std::string& arg : args)
    if (arg == "--preflight" || arg.starts_with("--preflight="))
      return usage_error("mcprun doctor --collectives runs the preflight itself: drop " + arg);
  const auto no_op = find_executable("true", search_path_of(current_environment()));
  if (!no_op)
    return usage_error("mcprun doctor --collectives: no 'true' on PATH to run after the check");
  args.insert(args.end(), {"--preflight=fail", "--no-python", *no_op});
  const int code = run_launch(args);
  return code == kExitPreflightFailed ? kExitFailure : code;
}

}  // namespace
}  // namespace mcprun

int main(int argc, char** argv) {
  using namespace mcprun;
  // A console that went away must not kill the launcher mid-teardown.
  ::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (!args.empty() &&
        (args.front() == "jobs" || args.front() == "status" || args.front() == "stop")) {
      init_logging("mcprun", false);
      return run_operator_command(args);
    }
    if (!args.empty() && args.front() == "topo") {
      init_logging("mcprun", false);
      return show_topology();
    }
    if (!args.empty() && args.front() == "store")
      return run_store_command({args.begin() + 1, args.end()});
    if (!args.empty() && args.front() == "hostnames") {  // As `scontrol show hostnames`.
      if (args.size() != 2) return usage_error("usage: mcprun hostnames 'n[1-4],gpu-[01-02]'");
      auto hosts = expand_hostlist(args[1]);
      if (!hosts) return usage_error(hosts.error().message);
      for (const auto& host : *hosts) std::cout << host << "\n";
      return kExitSuccess;
    }
    if (!args.empty() && args.front() == "doctor") {
      std::vector<std::string> rest(args.begin() + 1, args.end());
      if (std::find(rest.begin(), rest.end(), "--collectives") != rest.end())
        return run_collectives_check(std::move(rest));
      return run_doctor(rest);
    }
    return run_launch(args);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "mcprun: fatal: %s\n", error.what());
    return kExitFailure;
  }
}
