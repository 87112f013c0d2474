// What --metrics-port serves: this node's workers and, on the node that serves the job store,
// every rank's collectives as the straggler watch lines them up, in Prometheus' text format.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/supervise/worker_group.hpp"
#include "launcher/watch/straggler_watch.hpp"

namespace mcprun {

struct NodeMetrics {
  int workers_running = 0;
  int workers_exited = 0;
  int restarts = 0;
  /// Empty but on the store's node, or before the first collectives complete (torch 2.x only).
  std::map<int, RankArrivals> arrivals;
  std::optional<int> straggler;     ///< The rank named a straggler now.
  double straggler_cost_share = 0;  ///< Of the window, the others' time spent waiting for it.
  size_t stragglers_named = 0;      ///< Named in this attempt.
  std::vector<BandwidthFigure> bandwidth;  ///< Per group, op and size, over the window.
  size_t slow_collectives_named = 0;       ///< Named in this attempt.
  uint64_t resident_bytes = 0;
};

/// This node's figures now: its workers, its restarts so far, and what its straggler watch (on
/// the store's node; else null) has seen.
NodeMetrics node_metrics_now(const std::vector<WorkerStatus>& workers, int restarts,
                             const StragglerWatch* stragglers);

/// `metrics` in the text exposition format 0.0.4, names beside rendezvousd's (mcprun_*).
std::string render_node_metrics(const NodeMetrics& metrics);

}  // namespace mcprun
