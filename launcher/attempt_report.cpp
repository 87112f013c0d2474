#include "launcher/attempt_report.hpp"

#include <cstdio>
#include <fstream>

#include "common/logging.hpp"
#include "launcher/supervise/failure_report.hpp"
#include "launcher/watch/stall_report.hpp"

namespace mcprun {
namespace {

/// One line per straggler and slow collective the attempt named: a crawl before a failure or a
/// stall is often its first sign.
void say_stragglers_before_the_end(const StallWatch& watch) {
  for (const StragglerEpisode& straggler : watch.stragglers())
    spdlog::warn(
        "before the end, rank {} was named a straggler ({} to {}): last at {:.0f}% of "
        "the {} on group {}, {:.0f} ms behind; {}",
        straggler.rank, utc_timestamp(straggler.first_seen), utc_timestamp(straggler.last_seen),
        100 * straggler.share, straggler.step_s > 0 ? "steps" : "collectives", straggler.group,
        1000 * straggler.median_lag_s, straggler.cause);
  for (const SlowCollective& slow : watch.slow_collectives())
    spdlog::warn(
        "before the end, {} of {} on group {} was named slow ({} to {}): {:.3g} GB/s, "
        "{:.3g} GB/s before",
        slow.op, slow.size, slow.group, utc_timestamp(slow.first_seen),
        utc_timestamp(slow.last_seen), slow.busbw_now / 1e9, slow.busbw_before / 1e9);
}

/// Points a failure or stall report at each rank's NCCL log, under --nccl-debug.
void name_nccl_logs(const LaunchConfig& config, const AttemptResult& result,
                    const AttemptFiles& files) {
  if (!config.nccl_debug) return;
  std::fputs("NCCL debug logs (--nccl-debug):\n", stderr);
  for (const WorkerOutcome& worker : result.workers)
    std::fprintf(stderr, "  rank %d: %s\n", worker.rank,
                 nccl_log_pattern(files.attempt_dir / std::to_string(worker.local_rank)).c_str());
}

}  // namespace

HintJob hint_job(const NodeFacts& node, const std::map<int, int>& pids) {
  const RankPlan& plan = node.plan;
  HintJob job;
  job.node_gpus = node.node_gpus;
  job.pinned = plan.pinned;
  job.no_pin = node.config.no_pin;
  if (auto visible = node.inherited.find("CUDA_VISIBLE_DEVICES"); visible != node.inherited.end())
    job.inherited_visible_devices = visible->second;
  for (const Environment* env : {&plan.extra_env, &node.inherited})  // The user's value wins.
    if (auto set = env->find("NCCL_SOCKET_IFNAME"); set != env->end())
      job.socket_interface = set->second;
  job.master_port = plan.job.master_port;
  for (const RankSlot& slot : plan.slots) {
    HintRank& rank = job.ranks[slot.identity.rank];
    rank.local_rank = plan.job.virtual_local_rank ? 0 : slot.identity.local_rank;
    rank.visible_gpus = slot.identity.visible_gpus;
    if (auto pid = pids.find(slot.identity.rank); pid != pids.end()) rank.pid = pid->second;
  }
  return job;
}

void add_stall_hints(const NodeFacts& node, const std::vector<WorkerStatus>& workers,
                     std::vector<RankProgress>& local) {
  std::map<int, int> pids;
  for (const WorkerStatus& worker : workers) pids[worker.rank] = worker.pid;
  const HintJob job = hint_job(node, pids);
  for (RankProgress& rank : local)
    rank.hint = failure_hint(rank.rank, {rank.last_line}, job, node.probes).value_or("");
}

void report_worker_failure(const NodeFacts& node, const AttemptResult& result,
                           const AttemptFiles& files, int restart_count,
                           const AttemptLastSeen& last_seen, const StallWatch& watch,
                           RunSummary& summary) {
  std::map<int, int> pids;
  for (const WorkerOutcome& worker : result.workers) pids[worker.rank] = worker.pid;
  const WorkerOutcome& root = result.workers[result.first_failure];
  HintJob job = hint_job(node, pids);
  for (const WorkerOutcome& worker : result.workers) {
    if (!worker.failed() && !worker.stopped_by_launcher)
      job.finished_at[worker.rank] = worker.exit_time;
    // Still in its interpreter's teardown when mcprun stopped it, its script long done.
    if (auto exiting = last_seen.exiting.find(worker.rank);
        worker.stopped_by_launcher && exiting != last_seen.exiting.end())
      job.exiting_at[worker.rank] = exiting->second;
  }
  job.failed_at = root.exit_time;
  const std::string hint =
      failure_hint(root.rank, failure_text(root), job, node.probes).value_or("");
  summary.set_hint(hint);
  summary.set_early_finisher(early_finisher(root.rank, failure_text(root), job));
  std::fputs(format_failure_report(result.workers, result.first_failure, node.host, restart_count,
                                   node.config.max_restarts, last_seen.in_collectives, hint)
                 .c_str(),
             stderr);
  say_stragglers_before_the_end(watch);
  name_nccl_logs(node.config, result, files);
}

void report_stall(const NodeFacts& node, const AttemptResult& result, const AttemptFiles& files,
                  const StallWatch& watch, RunSummary& summary) {
  const std::string report =
      format_stall_report(*result.stall, summary.stall_ranks, node.plan.job.world_size);
  // The summary's hint: a rank the others waited for first, else any rank whose output matched.
  const int furthest = furthest_level(summary.stall_ranks);
  const RankProgress* hinted = nullptr;
  for (const RankProgress& rank : summary.stall_ranks)
    if (!rank.hint.empty() && (!hinted || (rank.level < furthest && hinted->level >= furthest)))
      hinted = &rank;
  if (hinted) summary.set_hint(hinted->hint);
  std::fputs(report.c_str(), stderr);
  say_stragglers_before_the_end(watch);
  const auto report_file = files.attempt_dir / "stall_report.txt";
  std::ofstream(report_file) << report;
  spdlog::info("stall report saved to {}", report_file.string());
  name_nccl_logs(node.config, result, files);
}

}  // namespace mcprun
