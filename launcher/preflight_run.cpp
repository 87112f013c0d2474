#include "launcher/preflight_run.hpp"

#include <fmt/format.h>

#include <boost/asio/steady_timer.hpp>
#include <cstdio>
#include <fstream>

#include "common/exit_status.hpp"
#include "common/logging.hpp"
#include "launcher/preflight/preflight_check.hpp"

namespace mcprun {
namespace {

/// Where the check's keys live in the job store (torch's clients add the leading slash); erased
/// before the script starts.
constexpr std::string_view kPreflightKeyPrefix = "/mcprun/preflight/";

/// One run of the check, with `transport`'s NCCL variables added, stopped at the budget's bound:
/// `report` as local rank 0 wrote it (or the bound's), or an exit code when the run ended
/// otherwise (a signal, another node's stop).
std::optional<int> preflight_pass(const PreflightJob& job, const std::string& python,
                                  const PreflightBudget& budget, size_t number,
                                  const Environment& transport, nlohmann::json& report) {
  AttemptFiles files = job.run_dir.attempt(0);
  files.attempt_dir = job.run_dir.path() / ("preflight_" + std::to_string(number));
  std::error_code ec;
  std::filesystem::create_directories(files.attempt_dir, ec);
  const auto bound = std::chrono::milliseconds(static_cast<long>(budget.bound_s * 1000));
  const PreflightPass pass{
      number, files.attempt_dir / "report.json", files.attempt_dir / "node.json",
      std::chrono::steady_clock::now() + bound, job.config.preflight_min_busbw};
  std::ofstream(pass.node_file) << preflight_node(job.plan, job.node);

  // The same ranks, pinning, binding and environment as the script, running the check instead.
  StandIn check{{python, "-u", "-m", "mcprun._preflight"}, transport};
  for (const auto& [name, value] : preflight_env(budget, pass)) check.env[name] = value;
  // The bound is kept whatever the ranks do: past it, the check is stopped and that is its finding.
  bool overran = false;
  boost::asio::steady_timer stop_at_bound(job.io, bound + std::chrono::seconds(1));
  stop_at_bound.async_wait([&](boost::system::error_code error) {
    if (error) return;
    overran = true;
    job.group.request_stop(
        fmt::format("the preflight ran past its bound of {:g} s", budget.bound_s),
        kExitPreflightFailed);
  });
  const AttemptResult result = job.group.run_attempt(0, files, &check);
  stop_at_bound.cancel();
  // Each pass has keys of its own: a node that starts the next pass first loses none of them.
  if (job.store) job.store->erase_prefix(fmt::format("{}{}/", kPreflightKeyPrefix, number));
  if (overran) {
    report = overran_preflight_report(budget);
    return std::nullopt;
  }

  // Another node that judged first may stop this one as its ranks leave: their report stands.
  const bool reported = std::filesystem::exists(pass.report_file, ec);
  switch (result.end) {
    case AttemptResult::End::kInterrupted:
      return exit_code_for_signal(result.interrupt_signal);
    case AttemptResult::End::kPeerStopped:
      if (reported && !job.timed_out) break;
      // Stopped before its own ranks judged: the judging node's verdict is this node's too.
      if (job.peer_verdict.is_object() && !job.timed_out) {
        report = job.peer_verdict;
        return std::nullopt;
      }
      spdlog::error("stopped during the preflight: {}", result.peer_reason);
      return job.timed_out ? kExitJobTimeout : result.peer_exit_code;
    case AttemptResult::End::kSpawnFailed:
      spdlog::error("cannot start the preflight: {}", result.spawn_error);
      return kExitFailure;
    default:
      break;
  }
  report = read_preflight_report(pass.report_file);
  return std::nullopt;
}

}  // namespace

PreflightOutcome run_preflight_check(const PreflightJob& job) {
  const auto python = find_executable(worker_python(job.inherited), search_path_of(job.inherited));
  if (!python || !python_helper_dir()) {
    spdlog::error(
        "--preflight needs python ({}) and mcprun's python folder next to mcprun "
        "(share/mcprun/python)",
        python.value_or(worker_python(job.inherited)));
    return {kExitFailure};
  }
  const PreflightBudget budget =
      preflight_budget(job.config.preflight_timeout, job.plan.job.world_size);
  spdlog::info(
      "preflight: checking {} rank(s) before the script, within {:g} s (step deadline "
      "{:g} s)",
      job.plan.job.world_size, budget.bound_s, budget.step_s);
  nlohmann::json report;
  if (auto code = preflight_pass(job, *python, budget, 0, {}, report)) return {code};
  if (!report.value("ok", false) && report.value("backend", std::string()) == "nccl" &&
      report.value("dead", false)) {
    // Which transport fails: every node retries alike, since every node got the same report.
    size_t pass = 0;
    for (const char* variable : {"NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"}) {
      nlohmann::json retry;
      spdlog::info("preflight: again with {}=1, within {:g} s", variable, budget.bound_s);
      if (auto code = preflight_pass(job, *python, budget, ++pass, {{variable, "1"}}, retry))
        return {code};
      report["retries"][variable] = retry.value("ok", false);
    }
    report["transport"] = nccl_transport_finding(report["retries"]);
    report["text"] = report.value("text", std::string()) +
                     "mcprun preflight: " + report["transport"].get<std::string>() + "\n";
  }
  std::fputs(report.value("text", std::string()).c_str(), stderr);
  const bool ok = report.value("ok", false);
  // A verdict that came from another node was sent by it already; this node's own goes out.
  const bool judged_here = !report.contains("judged_on");
  nlohmann::json verdict = judged_here && !ok ? verdict_for_peers(report, job.node) : nullptr;
  report.erase("text");
  // Its largest all-reduce: the floor under which the bandwidth watch calls one slow.
  if (const auto floor = preflight_floor(report))
    job.watch.set_bandwidth_floor(floor->first, floor->second);
  job.summary.set_preflight(std::move(report));
  if (ok) return {};
  if (job.config.preflight == LaunchConfig::Preflight::kWarn) {
    spdlog::warn("--preflight=warn: starting the script anyway");
    return {};
  }
  spdlog::error("--preflight=fail: not starting the script (exit {})",
                static_cast<int>(kExitPreflightFailed));
  return {kExitPreflightFailed, judged_here, std::move(verdict)};
}

}  // namespace mcprun
