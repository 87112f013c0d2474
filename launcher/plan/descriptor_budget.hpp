// How many open files a node's mcprun needs for its plan, so that a job RLIMIT_NOFILE cannot hold
// is refused before any worker starts rather than failing halfway through spawning them.
#pragma once

#include "common/expected.hpp"
#include "launcher/config/launch_config.hpp"
#include "launcher/plan/rank_plan.hpp"

namespace mcprun {

/// The launcher's own descriptors, whatever the job: the standard streams, the event loop's
/// epoll, eventfd and timerfd and those of the process control's launch context, the guardian's
/// pipe, the job store's and the helper's listeners, the FileTimer FIFO, a spawn's error pipe and
/// pidfd, a rendezvous connection. 18 measured at -n 1.
inline constexpr long kLauncherDescriptors = 32;
/// Per local rank, for the whole attempt: the read ends of its stdout and stderr pipes.
inline constexpr long kOutputPipeDescriptors = 2;
/// Per local rank until it is started: the pipes' other ends. Every rank's pipes are made before
/// the first worker starts, so while the group starts each rank holds 4 (8016 at -n 2000).
inline constexpr long kChildEndDescriptors = 2;
/// Per local rank during a stall's stack dumps: its dump file and two pidfds (rank, dumper).
inline constexpr long kStackDumpDescriptors = 3;
/// Per local rank when logs are kept (--log-dir, --redirects, --tee): stdout.log, stderr.log.
inline constexpr long kLogFileDescriptors = 2;
/// Per local rank: its connection to the helper channel (mcprun.heartbeat(), mcprun.barrier()).
inline constexpr long kHelperDescriptors = 1;
/// Per rank of the job, on the node that serves the job store, for torch's own client: one
/// connection from torch 2.1 on, two before (a second for watch_key's callbacks, removed by
/// pytorch#105014), and two where the workers' torch is not known. Counted with `ss` against a
/// gloo job's store: torch 2.13 1, torch 1.13 2.
long torch_store_connections(const std::optional<TorchVersion>& torch);
/// Per rank of the job on that node, while the collective watchdog is on: the progress
/// reporter's own store connection (worker_helper/mcprun/_progress.py), beside torch's.
inline constexpr long kProgressReporterDescriptors = 1;
/// The store connections one rank of the job opens: torch's and the progress reporter's.
long store_connections_per_rank(const LaunchConfig& config, const RankPlan& plan);

/// An upper bound on the open files this node's mcprun holds at once for `plan`; `log_files` says
/// whether each rank's output is also written to files. A rendezvous may make any node the one
/// that serves the store, so there every node counts the most ranks the job may have.
long descriptors_needed(const LaunchConfig& config, const RankPlan& plan, bool log_files);

/// A one-line usage error when `needed` open files exceed `limit` (RLIMIT_NOFILE's soft limit,
/// already raised to the hard one): how many the plan needs, the limit, how to raise it.
Expected<void> check_descriptor_limit(const LaunchConfig& config, const RankPlan& plan, long needed,
                                      long limit);

}  // namespace mcprun
