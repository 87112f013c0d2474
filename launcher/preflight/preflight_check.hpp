#pragma once
// The preflight's side in the launcher: its budget, the environment its ranks get, the node's
// facts they report, and the report they leave (worker_helper/mcprun/_preflight.py runs the check).

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "common/sys.hpp"
#include "launcher/plan/rank_plan.hpp"

namespace mcprun {

/// How long the check may take: each step's deadline, each round of pair exchanges', and the
/// whole check's bound, which the launcher prints first and stops the check at.
struct PreflightBudget {
  double step_s = 0;   ///< --preflight-timeout: init, all-reduce, and the liveness after a failure.
  double round_s = 0;  ///< One round-robin round of pair exchanges.
  int rounds = 0;      ///< n-1 rounds for n ranks (n when n is odd).
  double bound_s = 0;  ///< From the interpreters' start to the report.
};

/// The budget for `world_size` ranks at a step deadline of `step_s`.
PreflightBudget preflight_budget(double step_s, int world_size);

/// What one pass of the check needs to know, besides the ranks' own environment.
struct PreflightPass {
  size_t number = 0;                          ///< 0, then the NCCL retries.
  std::filesystem::path report_file;          ///< Local rank 0 writes the report here.
  std::filesystem::path node_file;            ///< This node's facts (preflight_node).
  std::chrono::steady_clock::time_point end;  ///< The bound's end, on this node's clock.
  double min_busbw_gbps = 0;                  ///< --preflight-min-busbw.
};

/// The variables the check's ranks get on top of the script's environment.
Environment preflight_env(const PreflightBudget& budget, const PreflightPass& pass);

/// What the check's table shows of this node: its name and each local rank's GPU.
nlohmann::json preflight_node(const RankPlan& plan, const std::string& node);

/// The report local rank 0 wrote, or a failed one saying why there is none.
nlohmann::json read_preflight_report(const std::filesystem::path& file);

/// The report of a check stopped at its bound: a finding, like any other fault.
nlohmann::json overran_preflight_report(const PreflightBudget& budget);

/// What of `report`, judged on `node`, travels to the other nodes with its stop, bounded to fit
/// one message: the verdict, its faults, and the table when short (a large job's is not).
nlohmann::json verdict_for_peers(const nlohmann::json& report, const std::string& node);

/// The largest measured all-reduce's size and bus bandwidth (bytes/s): the floor under which the
/// bandwidth watch calls the job's own all-reduces slow. nullopt when the check measured none.
std::optional<std::pair<int64_t, double>> preflight_floor(const nlohmann::json& report);

/// What the NCCL retries say of the transports, from whether each passed.
std::string nccl_transport_finding(const nlohmann::json& retries);

}  // namespace mcprun
