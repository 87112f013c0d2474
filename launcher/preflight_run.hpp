// --preflight before the first attempt: the check (`python -m mcprun._preflight`) runs as every
// rank of the job, through the job's own worker group, and is stopped at its bound
// (docs/preflight.md).
#pragma once

#include <boost/asio/io_context.hpp>
#include <optional>
#include <string>

#include "launcher/config/launch_config.hpp"
#include "launcher/plan/rank_plan.hpp"
#include "launcher/report/run_summary.hpp"
#include "launcher/run_directory.hpp"
#include "launcher/store/tcp_store.hpp"
#include "launcher/supervise/worker_group.hpp"
#include "launcher/watch/stall_watch.hpp"

namespace mcprun {

/// What the check runs with: the job's plan, group and folder, and where its findings go.
struct PreflightJob {
  boost::asio::io_context& io;
  const LaunchConfig& config;
  const RankPlan& plan;
  const Environment& inherited;
  std::string node;  ///< This node's name in the report's table.
  WorkerGroup& group;
  RunDirectory& run_dir;
  TcpStoreServer*
      store;            ///< The job store on its node, whose preflight keys are erased; else null.
  StallWatch& watch;    ///< Gets the check's largest all-reduce as its bandwidth floor.
  RunSummary& summary;  ///< Gets the report.
  const bool& timed_out;  ///< --timeout passed meanwhile.
  /// What a node that judged first sent with its stop (null until then): this node's verdict
  /// too, when the stop came before its own ranks wrote theirs.
  const nlohmann::json& peer_verdict;
};

/// How the check ended for the launch.
struct PreflightOutcome {
  std::optional<int> exit_code;      ///< nullopt: start the script.
  bool judged_failed = false;        ///< The check named a fault under --preflight=fail.
  nlohmann::json verdict = nullptr;  ///< When judged_failed: what the other nodes are sent.
};

/// Runs the check, then again under NCCL_P2P_DISABLE and NCCL_SHM_DISABLE when NCCL was dead, to
/// name the transport; prints the report.
PreflightOutcome run_preflight_check(const PreflightJob& job);

}  // namespace mcprun
