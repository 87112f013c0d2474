// The one place that builds a worker's environment: torchrun's contract plus GPU pinning.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/sys.hpp"
#include "common/topology.hpp"

namespace mcprun {

/// torch 2.x runs its init barrier only when this variable is "1"; mcprun sets it unless the
/// user did.
inline constexpr const char* kInitBarrierVariable = "TORCH_DIST_INIT_BARRIER";

/// The variables mcprun sets for every worker (an inherited value is replaced): RANK, ...,
/// MASTER_PORT and every TORCHELASTIC_*.
bool owned_by_launcher(const std::string& name);

/// Job-wide facts every worker of one attempt shares.
struct JobIdentity {
  std::string master_addr;
  int master_port = 0;
  std::string run_id;
  std::string role;
  int max_restarts = 0;
  int local_world_size = 1;
  int world_size = 1;
  int group_rank = 0;
  int group_world_size = 1;
  /// torchrun 2.x's --virtual-local-rank: each worker sees only its own GPU, and LOCAL_RANK=0.
  bool virtual_local_rank = false;
  /// TORCHELASTIC_SIGNALS_TO_HANDLE, as torchrun 2.x exports it.
  std::string signals_to_handle;
  /// The one async-error-handling name the workers' torch reads (torch_version.hpp); the other
  /// name is never set, so no rank prints torch's deprecation warning.
  std::string nccl_async_error_handling = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
};

/// One worker's place in the job.
struct WorkerIdentity {
  int local_rank = 0;
  int rank = 0;
  std::optional<GpuDevice> gpu;  ///< Set when the worker is pinned: the GPU cuda:LOCAL_RANK is.
  /// CUDA_VISIBLE_DEVICES entries, in the order CUDA numbers them: every GPU of the node, so that
  /// `cuda:LOCAL_RANK` is `gpu` (or `gpu` alone under --virtual-local-rank). Empty: not pinned.
  std::vector<std::string> visible_gpus;
};

/// The variables mcprun sets for one worker, i.e. the delta over the inherited environment.
Environment worker_env_delta(const JobIdentity& job, const WorkerIdentity& worker,
                             int restart_count, const std::string& error_file,
                             const Environment& inherited);

/// inherited + delta, as "KEY=VALUE" strings ready for exec.
std::vector<std::string> merge_environment(const Environment& inherited, const Environment& delta);

/// One line per inherited variable that would fight mcprun's own value (FIELD.md's "two parties
/// own the process group"), naming the variable and both values; plus the OMP_NUM_THREADS note.
std::vector<std::string> environment_warnings(const JobIdentity& job, const Environment& inherited);

}  // namespace mcprun
