#include "rendezvousd/daemon_metrics.hpp"

#include <fmt/format.h>

#include "common/prometheus_text.hpp"

namespace mcprun {

std::string render_metrics(const ServerStats& stats, const ServerLoad& load,
                           uint64_t resident_bytes) {
  PrometheusText out;
  out.family("mcprun_jobs", "gauge",
             "Jobs the daemon holds, by state; finished ones until finished_job_ttl_s.");
  out.sample("mcprun_jobs", label_set({{"state", "joining"}}), load.joining);
  out.sample("mcprun_jobs", label_set({{"state", "running"}}), load.running);
  out.sample("mcprun_jobs", label_set({{"state", "finished"}}), load.finished);
  out.family("mcprun_nodes", "gauge", "Nodes of the jobs that have not finished.");
  out.sample("mcprun_nodes", "", load.nodes);
  out.family("mcprun_connections", "gauge", "Open agent and operator connections.");
  out.sample("mcprun_connections", "", load.connections);
  out.family("mcprun_rendezvous_rounds_total", "counter", "Rendezvous rounds that completed.");
  out.sample("mcprun_rendezvous_rounds_total", "", stats.rounds);
  constexpr std::string_view kDuration = "mcprun_rendezvous_round_duration_seconds";
  out.family(kDuration, "histogram", "Time from a round's first join to its completion.");
  for (size_t i = 0; i < ServerStats::kRoundBuckets.size(); ++i)
    out.sample(fmt::format("{}_bucket", kDuration),
               label_set({{"le", fmt::format("{}", ServerStats::kRoundBuckets[i])}}),
               stats.rounds_within[i]);
  out.sample(fmt::format("{}_bucket", kDuration), label_set({{"le", "+Inf"}}), stats.rounds);
  out.sample(fmt::format("{}_sum", kDuration), "", stats.round_seconds);
  out.sample(fmt::format("{}_count", kDuration), "", stats.rounds);
  out.family("mcprun_failures_total", "counter",
             "Rounds ended by a worker failure or a lost node.");
  out.sample("mcprun_failures_total", "", stats.failures);
  out.family("mcprun_stalls_total", "counter", "Rounds ended by a stall.");
  out.sample("mcprun_stalls_total", "", stats.stalls);
  out.family("mcprun_restarts_total", "counter",
             "Jobs re-forming after a failure, a stall or a lost node.");
  out.sample("mcprun_restarts_total", "", stats.restarts);
  out.family("mcprun_heartbeats_total", "counter", "Heartbeats received from agents.");
  out.sample("mcprun_heartbeats_total", "", stats.heartbeats);
  out.family("mcprun_gpu_leases", "gauge", "GPUs leased to jobs on this host.");
  out.sample("mcprun_gpu_leases", "", load.leased_gpus);
  out.family("mcprun_port_leases", "gauge", "Master ports leased to jobs on this host.");
  out.sample("mcprun_port_leases", "", load.leased_ports);
  out.family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
  out.sample("process_resident_memory_bytes", "", resident_bytes);
  return out.text();
}

}  // namespace mcprun
