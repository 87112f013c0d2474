#include "launcher/plan/descriptor_budget.hpp"

#include <algorithm>
#include <string>

namespace mcprun {

long torch_store_connections(const std::optional<TorchVersion>& torch) {
  const bool callback_client =
      !torch || torch->major < 2 || (torch->major == 2 && torch->minor < 1);
  return callback_client ? 2 : 1;
}

long store_connections_per_rank(const LaunchConfig& config, const RankPlan& plan) {
  return torch_store_connections(plan.torch) +
         (config.stall.collective_timeout > 0 ? kProgressReporterDescriptors : 0);
}

long descriptors_needed(const LaunchConfig& config, const RankPlan& plan, bool log_files) {
  const long local_ranks = static_cast<long>(plan.slots.size());
  // The pipes' child ends are gone before a stall's stack dumps open theirs.
  const long stack_dumps = config.stack_dumps ? kStackDumpDescriptors : 0;
  const long per_rank = kOutputPipeDescriptors + std::max(kChildEndDescriptors, stack_dumps) +
                        (log_files ? kLogFileDescriptors : 0) + kHelperDescriptors;
  long store_clients = 0;
  if (config.uses_rendezvous())
    store_clients = local_ranks * config.max_nodes;
  else if (plan.job.group_rank == 0)
    store_clients = plan.job.world_size;
  const long rendezvous_peers = config.uses_rendezvous() ? config.max_nodes : 0;
  return kLauncherDescriptors + local_ranks * per_rank +
         store_clients * store_connections_per_rank(config, plan) + rendezvous_peers;
}

Expected<void> check_descriptor_limit(const LaunchConfig& config, const RankPlan& plan, long needed,
                                      long limit) {
  if (needed <= limit) return {};
  const std::string workers = std::to_string(plan.slots.size());
  std::string nproc = "-n " + workers;
  if (config.nproc.kind != NprocSpec::Kind::kCount) {
    const char* word = config.nproc.kind == NprocSpec::Kind::kGpu   ? "gpu"
                       : config.nproc.kind == NprocSpec::Kind::kCpu ? "cpu"
                                                                    : "auto";
    nproc = std::string("-n ") + word + " (" + workers + " workers)";
  }
  const std::string n = std::to_string(needed);
  return Error{nproc + " needs up to " + n + " open files in mcprun, more than its limit of " +
               std::to_string(limit) + " (ulimit -n, raised to the hard limit, ulimit -Hn): " +
               "raise both, e.g. `ulimit -Hn " + n + "; ulimit -n " + n + "` as root or nofile " +
               "in /etc/security/limits.conf, or start fewer workers"};
}

}  // namespace mcprun
