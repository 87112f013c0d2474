// mcprun inside a Slurm allocation: what a step's SLURM_* variables say about the job (nodes,
// this node's rank, the master, the run id, the GPUs granted), and Slurm's hostlist expressions.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/expected.hpp"
#include "common/sys.hpp"
#include "launcher/config/launch_config.hpp"

namespace mcprun {

/// The master port a Slurm job gets when nothing names one: 20000 + job id % 10000. Every node
/// computes it alone from SLURM_JOB_ID; the range sits below Linux's ephemeral ports
/// (32768-60999), so an outgoing connection never holds it, and two jobs sharing a node differ
/// unless their ids are 10000 apart.
inline constexpr int kSlurmPortBase = 20000;
inline constexpr int kSlurmPortSpan = 10000;
/// Slurm's default KillWait (seconds between SIGTERM and SIGKILL), when neither SLURM_KILL_WAIT
/// nor the slurm.conf mcprun can read says otherwise.
inline constexpr double kSlurmDefaultKillWait = 30;
/// How much of KillWait mcprun keeps for itself (reaping, its report) after its workers' grace.
inline constexpr double kSlurmKillWaitMargin = 2;
/// How long `scontrol show node` may take to name a node's address: a wedged slurmctld must not
/// hold up the launch.
inline constexpr std::chrono::seconds kScontrolTimeout{5};

/// Expands a hostlist expression as `scontrol show hostnames` does: "n[1-2],gpu-[01-04,07]",
/// zero padding kept, several bracket groups in one name multiplied out. The one-line error
/// names the expression otherwise.
Expected<std::vector<std::string>> expand_hostlist(std::string_view text);

/// Expands Slurm's task-count lists: "8(x2),4" -> {8, 8, 4}; nullopt when malformed.
std::optional<std::vector<int>> expand_tasks_per_node(std::string_view text);

/// One Slurm step as mcprun sees it from its environment.
struct SlurmStep {
  std::string job_id;
  std::string step_id;
  int nnodes = 1;
  int node_id = 0;
  std::vector<std::string> hosts;   ///< The step's nodes, in Slurm's order.
  std::optional<std::string> gpus;  ///< The GPUs Slurm granted, CUDA_VISIBLE_DEVICES syntax.
  int max_tasks_per_node = 1;       ///< More than 1 is the srun -n N mistake.
  std::string run_id() const { return job_id + "." + step_id; }
  int master_port() const;
};

/// The step mcprun runs in, or nullopt when not under Slurm (no SLURM_JOB_ID or no step) or
/// when MCPRUN_SLURM=0. A malformed variable is an error naming it.
Expected<std::optional<SlurmStep>> detect_slurm_step(const Environment& env);

/// Resolves `host` to an address the other nodes can reach: getaddrinfo, else the NodeAddr
/// Slurm knows it by (scontrol show node). nullopt when neither works.
std::optional<std::string> resolve_slurm_host(const std::string& host);

/// KillWait: SLURM_KILL_WAIT when exported, else KillWait= in $SLURM_CONF (or
/// /etc/slurm/slurm.conf), else Slurm's default.
double slurm_kill_wait(const Environment& env);

/// Whether the user set a flag themselves (command line, job file or PET_* variable), by its
/// long dashed name ("master-port"): Slurm's values never replace those.
using ExplicitFlag = std::function<bool(const std::string& dashed)>;

/// Fills what the user left unset from the step: nnodes, node rank, master address and port
/// (or, with --rdzv-backend c10d, the rendezvous endpoint that node 0 hosts), run id, GPUs and
/// the SIGTERM grace within KillWait. Adds the one info line that says what came from Slurm.
/// Fails with the one-line usage error (more than one task per node, a malformed variable).
Expected<void> apply_slurm(LaunchConfig& config, const Environment& env,
                           const ExplicitFlag& set_by_user,
                           const std::function<std::optional<std::string>(const std::string&)>&
                               resolve = resolve_slurm_host);

}  // namespace mcprun
