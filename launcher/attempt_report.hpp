// What a node says when an attempt ends badly: the failure report with its hint, the stall report
// over every node's ranks, the stragglers and slow collectives seen before the end, and the ranks'
// NCCL logs under --nccl-debug. Each also goes to the run summary.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "common/sys.hpp"
#include "common/topology.hpp"
#include "launcher/config/launch_config.hpp"
#include "launcher/diagnose/failure_hints.hpp"
#include "launcher/plan/rank_plan.hpp"
#include "launcher/report/run_summary.hpp"
#include "launcher/supervise/worker_group.hpp"
#include "launcher/watch/stall_watch.hpp"

namespace mcprun {

/// What the hints know of this node's part of the job, fixed once the plan is.
struct NodeFacts {
  const LaunchConfig& config;
  const RankPlan& plan;
  const Environment& inherited;
  const std::vector<GpuDevice>& node_gpus;  ///< Every GPU discovered here, leased or not.
  const HintProbes& probes;
  std::string host;
};

/// This node's ranks as the failure hints see them; `pids` by global rank.
HintJob hint_job(const NodeFacts& node, const std::map<int, int>& pids);

/// A stall's diagnosis of this node's ranks, each with the hint its last output line matches.
void add_stall_hints(const NodeFacts& node, const std::vector<WorkerStatus>& workers,
                     std::vector<RankProgress>& local);

/// Where the ranks were as the attempt ended, from the watchdogs' last records.
struct AttemptLastSeen {
  std::map<int, std::string> in_collectives;  ///< By the collective watchdog.
  /// When each rank's interpreter began to exit, its script done.
  std::map<int, std::chrono::system_clock::time_point> exiting;
};

/// The report of an attempt a worker failed, on stderr, with its hint; the hint and an early
/// finisher go to the summary too.
void report_worker_failure(const NodeFacts& node, const AttemptResult& result,
                           const AttemptFiles& files, int restart_count,
                           const AttemptLastSeen& last_seen, const StallWatch& watch,
                           RunSummary& summary);

/// The stall report over `summary.stall_ranks` (every node's), on stderr and in the attempt's
/// folder; the summary's hint is the rank the others waited for.
void report_stall(const NodeFacts& node, const AttemptResult& result, const AttemptFiles& files,
                  const StallWatch& watch, RunSummary& summary);

}  // namespace mcprun
