// The launch plan: which local rank runs what, on which GPU and CPUs. Built once, before spawning.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/expected.hpp"
#include "common/topology.hpp"
#include "launcher/config/launch_config.hpp"
#include "launcher/plan/torch_version.hpp"
#include "launcher/plan/worker_env.hpp"

namespace mcprun {

/// One local rank of the plan.
struct RankSlot {
  WorkerIdentity identity;
  std::vector<int> cpus;  ///< CPU affinity to set before exec; empty: inherit.
};

/// Everything a launch needs that does not change between restarts.
struct RankPlan {
  JobIdentity job;
  std::vector<RankSlot> slots;
  std::vector<std::string> argv;      ///< The worker command line, identical for every rank.
  bool pinned = false;                ///< Workers get CUDA_VISIBLE_DEVICES.
  Environment extra_env;              ///< Job-wide additions, such as the socket interface.
  bool nccl_log_files = false;        ///< --nccl-debug: NCCL writes each rank's log in its folder.
  std::optional<TorchVersion> torch;  ///< The workers' torch, where found: what its client opens.
  std::vector<std::string> warnings;
};

/// Where this node sits in a multi-node job, as the rendezvous (or static flags) decided.
struct JobPlacement {
  int group_rank = 0;
  int group_world_size = 1;
  int world_size = 1;
  int rank_offset = 0;  ///< Global rank of this node's local rank 0.
  std::string master_addr;
  int master_port = 0;
};

/// Moves a single-node plan into its place in the job: global ranks, sizes, the store address.
void place_in_job(RankPlan& plan, const JobPlacement& placement);

/// The network interface that holds `local_address` (the address this node reaches its peers
/// from); nullopt when none does.
std::optional<std::string> interface_for_address(const std::string& local_address);

/// Sets NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME to `interface` for every worker, unless the
/// user set them: NCCL and Gloo otherwise may pick lo or a docker bridge and never connect.
void set_socket_interface(RankPlan& plan, const std::string& interface,
                          const Environment& inherited);

/// Resolves nproc, GPU pinning, CPU binding and the command line. Returns a one-line error for
/// bad input (missing script, more pinned ranks than GPUs, no GPU for `-n gpu`, ...).
Expected<RankPlan> build_rank_plan(const LaunchConfig& config, std::vector<GpuDevice> discovered,
                                   const Environment& inherited, int master_port);

/// Where each rank's Flight Recorder dump goes on a collective stall: one folder per attempt
/// holding only "rank_<R>" files, the layout torch's fr_trace.py reads (TORCH_FR_DUMP_TEMP_FILE
/// is this prefix, as torch's own dumps use it).
inline std::filesystem::path flight_recorder_prefix(const std::filesystem::path& attempt_dir) {
  return attempt_dir / "flight_recorder" / "rank_";
}

/// Where --nccl-debug has NCCL write a rank's log (NCCL expands %h to the host, %p to the pid).
inline std::string nccl_log_pattern(const std::filesystem::path& rank_dir) {
  return (rank_dir / "nccl.%h.%p.log").string();
}

/// Where torch's @record writes a rank's error (TORCHELASTIC_ERROR_FILE).
inline std::filesystem::path worker_error_file(const std::filesystem::path& rank_dir) {
  return rank_dir / "error.json";
}

/// What --dry-run names the run's folder, which a dry run never creates.
inline constexpr const char* kDryRunDir = "<run dir>";

/// What the ranks of one attempt run instead of the script (the preflight's check): its command
/// line, and variables over the plan's.
struct StandIn {
  std::vector<std::string> argv;
  Environment env;
};

/// The one builder of what a worker is started with beyond the inherited environment: its
/// torchrun variables (worker_env_delta), the plan's job-wide variables and --nccl-debug's log
/// file. `rank_dir` is <run dir>/attempt_<n>/<local rank>. Spawning and --dry-run both use it.
/// A stand-in's variables win over the plan's.
Environment worker_spawn_delta(const RankPlan& plan, const RankSlot& slot, int restart_count,
                               const std::filesystem::path& rank_dir, const Environment& inherited,
                               const StandIn* stand_in = nullptr);

/// torch's FileTimer pipe and the helper module's socket, under the run's runtime folder: where
/// the watchdogs listen and what every worker is told.
std::filesystem::path timer_file_in(const std::filesystem::path& runtime_dir);
std::filesystem::path agent_socket_in(const std::filesystem::path& runtime_dir);

/// The helper module (import mcprun) next to mcprun: <prefix>/share/mcprun/python, which the
/// build tree mirrors; nullopt when it is missing.
std::optional<std::filesystem::path> python_helper_dir();

/// What supervision adds to the plan's job-wide variables: the watchdogs' files under
/// `runtime_dir`, the collective watch's switch, and the helper module first on PYTHONPATH. A run
/// and --dry-run both add them here.
void add_supervision_env(RankPlan& plan, const std::filesystem::path& runtime_dir,
                         bool collective_watch, const Environment& inherited);

/// The --dry-run text: per rank its GPU, CPU set, environment delta and command line, the
/// environment as worker_spawn_delta builds it for the first attempt.
std::string format_rank_plan(const RankPlan& plan, const Environment& inherited);

/// The `mcprun topo` text: GPUs with NUMA node and switch, then the rank mapping.
std::string format_topology(const std::vector<GpuDevice>& discovered, const TopologyOrder& order);

/// The interpreter workers run: $PYTHON_EXEC (as torchrun's); else, when `launcher` (mcprun's own
/// file) lies in the bin/ of a Python environment that pip installed it into (a venv or a conda
/// env), that environment's python3, as torchrun runs its own sys.executable, activated or not;
/// else python3 from PATH (a /usr or source-tree mcprun).
std::string worker_python(const Environment& env,
                          const std::filesystem::path& launcher = self_executable());

}  // namespace mcprun
