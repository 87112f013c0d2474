#include "launcher/report/node_metrics.hpp"

#include <fmt/format.h>

#include <cmath>
#include <iterator>
#include <string_view>

namespace mcprun {
namespace {

/// A label value as the format quotes it: a rank's host name comes from its own records.
std::string escaped(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

/// Seconds to the microsecond: the clocks they come from are good to a fraction of a millisecond.
double microseconds(double seconds) { return std::round(seconds * 1e6) / 1e6; }

}  // namespace

std::string render_node_metrics(const NodeMetrics& metrics) {
  std::string out;
  auto family = [&](std::string_view name, std::string_view type, std::string_view help) {
    fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  auto sample = [&](std::string_view name, std::string_view labels, auto value) {
    fmt::format_to(std::back_inserter(out), "{}{}{}{} {}\n", name, labels.empty() ? "" : "{",
                   labels, labels.empty() ? "" : "}", value);
  };
  family("mcprun_workers", "gauge", "This node's workers in the current attempt, by state.");
  sample("mcprun_workers", R"(state="running")", metrics.workers_running);
  sample("mcprun_workers", R"(state="exited")", metrics.workers_exited);
  family("mcprun_restarts_total", "counter", "Times this node restarted its workers.");
  sample("mcprun_restarts_total", "", metrics.restarts);

  std::map<int, std::string> labels;
  for (const auto& [rank, counts] : metrics.arrivals)
    labels[rank] = fmt::format(R"(rank="{}",node="{}",local_rank="{}")", rank, escaped(counts.host),
                               counts.local_rank);
  auto per_rank = [&](std::string_view name, std::string_view type, std::string_view help,
                      auto value_of) {
    family(name, type, help);
    for (const auto& [rank, counts] : metrics.arrivals) sample(name, labels[rank], value_of(counts));
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
    straggler_labels = it != labels.end() ? it->second : fmt::format(R"(rank="{}")", *metrics.straggler);
  }
  family("mcprun_straggler", "gauge", "1 for the rank named a straggler now.");
  if (metrics.straggler) sample("mcprun_straggler", straggler_labels, 1);
  family("mcprun_straggler_cost_ratio", "gauge",
         "Of the straggler window, the share the others spent waiting for the rank named now.");
  if (metrics.straggler)
    sample("mcprun_straggler_cost_ratio", straggler_labels, std::round(metrics.straggler_cost_share * 1000) / 1000);
  family("mcprun_stragglers_named_total", "counter", "Stragglers named in this attempt.");
  sample("mcprun_stragglers_named_total", "", metrics.stragglers_named);
  family("mcprun_collective_bus_bandwidth_bytes_per_second", "gauge",
         "Bus bandwidth (nccl-tests' busbw) of the collectives of a group, op and size over the "
         "straggler window, from their completions (torch 2.x, on the store's node).");
  for (const BandwidthFigure& figure : metrics.bandwidth)
    sample("mcprun_collective_bus_bandwidth_bytes_per_second",
           fmt::format(R"(group="{}",op="{}",size="{}")", escaped(figure.group), escaped(figure.op), figure.size),
           std::round(figure.busbw));
  family("mcprun_collectives_timed_total", "counter",
         "Collectives of a group, op and size whose time the bandwidth figure counts.");
  for (const BandwidthFigure& figure : metrics.bandwidth)
    sample("mcprun_collectives_timed_total",
           fmt::format(R"(group="{}",op="{}",size="{}")", escaped(figure.group), escaped(figure.op), figure.size),
           figure.collectives);
  family("mcprun_slow_collectives_named_total", "counter", "Slow collectives named in this attempt.");
  sample("mcprun_slow_collectives_named_total", "", metrics.slow_collectives_named);
  family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
  sample("process_resident_memory_bytes", "", metrics.resident_bytes);
  return out;
}

}  // namespace mcprun
