#include "launcher/report/node_metrics.hpp"

#include <cmath>
#include <string_view>

#include "common/prometheus_text.hpp"

namespace mcprun {
namespace {

/// Seconds to the microsecond: the clocks they come from are good to a fraction of a millisecond.
double microseconds(double seconds) { return std::round(seconds * 1e6) / 1e6; }

}  // namespace

NodeMetrics node_metrics_now(const std::vector<WorkerStatus>& workers, int restarts,
                             const StragglerWatch* stragglers) {
  NodeMetrics metrics;
  for (const WorkerStatus& worker : workers)
    ++(worker.running ? metrics.workers_running : metrics.workers_exited);
  metrics.restarts = restarts;
  if (stragglers) {
    metrics.arrivals = stragglers->arrivals();
    if (const StragglerEpisode* current = stragglers->current()) {
      metrics.straggler = current->rank;
      metrics.straggler_cost_share = current->cost_share;
    }
    metrics.stragglers_named = stragglers->episodes().size();
    metrics.bandwidth = stragglers->bandwidth().figures();
    metrics.slow_collectives_named = stragglers->bandwidth().episodes().size();
  }
  metrics.resident_bytes = resident_memory_bytes();
  return metrics;
}

std::string render_node_metrics(const NodeMetrics& metrics) {
  PrometheusText out;
  out.family("mcprun_workers", "gauge", "This node's workers in the current attempt, by state.");
  out.sample("mcprun_workers", label_set({{"state", "running"}}), metrics.workers_running);
  out.sample("mcprun_workers", label_set({{"state", "exited"}}), metrics.workers_exited);
  out.family("mcprun_restarts_total", "counter", "Times this node restarted its workers.");
  out.sample("mcprun_restarts_total", "", metrics.restarts);

  std::map<int, std::string> labels;
  for (const auto& [rank, counts] : metrics.arrivals)
    labels[rank] = label_set({{"rank", std::to_string(rank)},
                              {"node", counts.host},
                              {"local_rank", std::to_string(counts.local_rank)}});
  auto per_rank = [&](std::string_view name, std::string_view type, std::string_view help,
                      auto value_of) {
    out.family(name, type, help);
    for (const auto& [rank, counts] : metrics.arrivals)
      out.sample(name, labels[rank], value_of(counts));
  };
  per_rank("mcprun_rank_collectives_total", "counter",
           "Collectives the rank took part in, every member's arrival seen (torch 2.x, on the "
           "store's node); rate() is the collective rate.",
           [](const RankArrivals& counts) { return counts.collectives; });
  per_rank("mcprun_rank_arrived_last_total", "counter",
           "Collectives at which the rank arrived last.",
           [](const RankArrivals& counts) { return counts.arrived_last; });
  per_rank("mcprun_rank_wait_seconds_total", "counter",
           "Time the rank waited in collectives for the last member to arrive.",
           [](const RankArrivals& counts) { return microseconds(counts.waited_s); });
  per_rank("mcprun_rank_arrival_lag_seconds", "gauge",
           "How far behind the others' median the rank was, the last time it arrived last.",
           [](const RankArrivals& counts) { return microseconds(counts.lag_s); });
  std::string straggler_labels;
  if (metrics.straggler) {
    auto it = labels.find(*metrics.straggler);
    straggler_labels =
        it != labels.end() ? it->second : label_set({{"rank", std::to_string(*metrics.straggler)}});
  }
  out.family("mcprun_straggler", "gauge", "1 for the rank named a straggler now.");
  if (metrics.straggler) out.sample("mcprun_straggler", straggler_labels, 1);
  out.family("mcprun_straggler_cost_ratio", "gauge",
             "Of the straggler window, the share the others spent waiting for the rank named now.");
  if (metrics.straggler)
    out.sample("mcprun_straggler_cost_ratio", straggler_labels,
               std::round(metrics.straggler_cost_share * 1000) / 1000);
  out.family("mcprun_stragglers_named_total", "counter", "Stragglers named in this attempt.");
  out.sample("mcprun_stragglers_named_total", "", metrics.stragglers_named);
  out.family(
      "mcprun_collective_bus_bandwidth_bytes_per_second", "gauge",
      "Bus bandwidth (nccl-tests' busbw) of the collectives of a group, op and size over the "
      "straggler window, from their completions (torch 2.x, on the store's node).");
  for (const BandwidthFigure& figure : metrics.bandwidth)
    out.sample("mcprun_collective_bus_bandwidth_bytes_per_second",
               label_set({{"group", figure.group}, {"op", figure.op}, {"size", figure.size}}),
               std::round(figure.busbw));
  out.family("mcprun_collectives_timed_total", "counter",
             "Collectives of a group, op and size whose time the bandwidth figure counts.");
  for (const BandwidthFigure& figure : metrics.bandwidth)
    out.sample("mcprun_collectives_timed_total",
               label_set({{"group", figure.group}, {"op", figure.op}, {"size", figure.size}}),
               figure.collectives);
  out.family("mcprun_slow_collectives_named_total", "counter",
             "Slow collectives named in this attempt.");
  out.sample("mcprun_slow_collectives_named_total", "", metrics.slow_collectives_named);
  out.family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
  out.sample("process_resident_memory_bytes", "", metrics.resident_bytes);
  return out.text();
}

}  // namespace mcprun
