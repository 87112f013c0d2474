// mcprun doctor, the command: its flags, the inputs it gathers, and the report it prints.
#include "launcher/commands/doctor.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "common/endpoint.hpp"
#include "common/exit_status.hpp"
#include "common/sys.hpp"
#include "common/topology.hpp"
#include "common/version.hpp"
#include "launcher/config/subcommand.hpp"
#include "launcher/plan/rank_plan.hpp"

namespace mcprun {
namespace {

std::string doctor_description() {
  return "mcprun doctor: this node's preflight checks for a distributed job, each with what was\n"
         "found and, for WARN and FAIL, what to do: /dev/shm size, the interface that routes to\n"
         "the master or the rendezvous, MASTER_PORT and the rendezvous endpoint, inherited\n"
         "variables that fight mcprun or change NCCL, GPUs (NUMA, PCIe link width and speed),\n"
         "RLIMIT_MEMLOCK, hostname resolution, inside a Slurm step what mcprun takes from it and\n"
         "whether its first node answers, and with --rdzv-endpoint the clock against the\n"
         "rendezvous (WARN above " +
         seconds_text(kClockWarnAbove) + " s of skew, FAIL above " + seconds_text(kClockFailAbove) +
         " s).\n\n"
         "MASTER_ADDR and MASTER_PORT from the environment are checked when the flags are not\n"
         "given. A connect waits at most " +
         seconds_text(kDoctorConnectTimeout) + " s, a clock reply " +
         seconds_text(kClockReplyTimeout) +
         " s.\nExit status: 0 when no check FAILed (WARNs included), 1 when one did, 2 for bad "
         "flags.";
}

struct StatusCounts {
  int ok = 0, warn = 0, fail = 0;
};

StatusCounts count(const std::vector<CheckResult>& results) {
  StatusCounts counts;
  for (const CheckResult& result : results) {
    if (result.status == CheckStatus::kOk)
      ++counts.ok;
    else if (result.status == CheckStatus::kWarn)
      ++counts.warn;
    else
      ++counts.fail;
  }
  return counts;
}

}  // namespace

std::string format_doctor_text(const std::vector<CheckResult>& results, bool colour) {
  auto paint = [&](CheckStatus status) {
    const char* code = status == CheckStatus::kOk     ? "32"
                       : status == CheckStatus::kWarn ? "33"
                                                      : "31";
    std::string padded = status_name(status);
    padded.resize(4, ' ');
    return colour ? std::string("\x1b[") + code + "m" + padded + "\x1b[0m" : padded;
  };
  std::string text;
  for (const CheckResult& result : results) {
    text += paint(result.status) + "  " + result.name + ": " + result.finding + "\n";
    if (result.status != CheckStatus::kOk && !result.remedy.empty())
      text += "      " + result.remedy + "\n";
  }
  const StatusCounts counts = count(results);
  text += "mcprun doctor: " + std::to_string(counts.ok) + " OK, " + std::to_string(counts.warn) +
          " WARN, " + std::to_string(counts.fail) + " FAIL\n";
  return text;
}

std::string format_doctor_json(const std::vector<CheckResult>& results) {
  // Ordered: a reader sees check, status, finding, remedy in that order.
  nlohmann::ordered_json checks = nlohmann::ordered_json::array();
  for (const CheckResult& result : results)
    checks.push_back({{"check", result.name},
                      {"status", status_name(result.status)},
                      {"finding", result.finding},
                      {"remedy", result.remedy}});
  const StatusCounts counts = count(results);
  nlohmann::ordered_json report = {{"checks", checks},
                                   {"summary",
                                    {{"ok", counts.ok},
                                     {"warn", counts.warn},
                                     {"fail", counts.fail},
                                     {"exit_code", doctor_exit_code(results)},
                                     {"mcprun_version", mcprun_version()}}}};
  return report.dump(2) + "\n";
}

int run_doctor(const std::vector<std::string>& args) {
  CLI::App app{doctor_description(), "mcprun doctor"};
  bool json = false, no_torch = false;
  std::string master_addr, rdzv_endpoint, shm = "/dev/shm";
  std::optional<int> master_port;
  app.add_flag("--json", json, "Print the checks as JSON instead of lines");
  app.add_option("--master-addr", master_addr,
                 "The master's address to check the route to (default: $MASTER_ADDR)");
  app.add_option("--master-port", master_port, "MASTER_PORT to check (default: $MASTER_PORT)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--rdzv-endpoint", rdzv_endpoint,
                 "HOST:PORT or unix:PATH of the rendezvous: reachability and clock skew");
  app.add_option("--shm", shm, "The shared-memory filesystem NCCL uses")->capture_default_str();
  app.add_flag("--no-torch", no_torch,
               "Skip the NCCL check, which imports torch in the workers' python ($PYTHON_EXEC, "
               "else the venv's python3 where pip installed mcprun, else python3)");
  // main runs it before the checks: listed here so that --help shows it.
  bool collectives = false;
  app.add_flag("--collectives", collectives,
               "Instead of these checks: the preflight over -n N ranks on this node (with "
               "--nnodes, --rdzv-endpoint... across nodes), as mcprun --preflight=fail runs it "
               "before a script; exit 1 when it names a slow or dead rank, GPU, node or link");
  if (auto done = parse_subcommand(app, args)) return *done;
  if (!rdzv_endpoint.empty()) {
    auto parsed = parse_endpoint(rdzv_endpoint, kConnectRules);
    if (!parsed) return usage_error("--rdzv-endpoint " + parsed.error().message);
  }

  DoctorInputs inputs;
  inputs.env = current_environment();
  inputs.sysfs_root = sysfs_root();
  inputs.shm_path = shm;
  inputs.hostname = host_name();
  auto from_env = [&](const char* name) {
    auto it = inputs.env.find(name);
    return it == inputs.env.end() ? std::string() : it->second;
  };
  inputs.master_addr = master_addr.empty() ? from_env("MASTER_ADDR") : master_addr;
  inputs.master_port = master_port ? std::to_string(*master_port) : from_env("MASTER_PORT");
  inputs.rdzv_endpoint = rdzv_endpoint;
  rlimit memlock{};
  if (::getrlimit(RLIMIT_MEMLOCK, &memlock) == 0 && memlock.rlim_cur != RLIM_INFINITY)
    inputs.memlock_bytes = static_cast<uint64_t>(memlock.rlim_cur);
  if (!no_torch) inputs.python = worker_python(inputs.env);

  SystemDoctorProbes probes;
  const std::vector<CheckResult> results = run_checks(inputs, probes);
  if (json) {
    std::fputs(format_doctor_json(results).c_str(), stdout);
  } else {
    const char* term = std::getenv("TERM");
    const bool colour = ::isatty(STDOUT_FILENO) && !std::getenv("NO_COLOR") &&
                        !(term && std::string_view(term) == "dumb");
    std::fputs(format_doctor_text(results, colour).c_str(), stdout);
  }
  return doctor_exit_code(results);
}

}  // namespace mcprun
