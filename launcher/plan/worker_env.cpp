#include "launcher/plan/worker_env.hpp"

#include <unistd.h>

extern char** environ;

namespace mcprun {
namespace {

/// Variables whose value differs per worker; a warning shows the range, not one value.
bool is_per_worker(const std::string& name) {
  return name == "RANK" || name == "LOCAL_RANK" || name == "ROLE_RANK" ||
         name == "TORCHELASTIC_ERROR_FILE";
}

}  // namespace

bool owned_by_launcher(const std::string& name) {
  static const char* const kOwned[] = {"RANK",        "LOCAL_RANK",       "GROUP_RANK",
                                       "ROLE_RANK",   "ROLE_NAME",        "LOCAL_WORLD_SIZE",
                                       "WORLD_SIZE",  "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
                                       "MASTER_ADDR", "MASTER_PORT"};
  for (const char* owned : kOwned)
    if (name == owned) return true;
  return name.rfind("TORCHELASTIC_", 0) == 0;
}

Environment worker_env_delta(const JobIdentity& job, const WorkerIdentity& worker,
                             int restart_count, const std::string& error_file,
                             const Environment& inherited) {
  auto inherited_or = [&](const char* name, const char* fallback) {
    auto it = inherited.find(name);
    return it == inherited.end() ? std::string(fallback) : it->second;
  };
  Environment env{
      {"LOCAL_RANK", std::to_string(job.virtual_local_rank ? 0 : worker.local_rank)},
      {"RANK", std::to_string(worker.rank)},
      {"GROUP_RANK", std::to_string(job.group_rank)},
      {"ROLE_RANK", std::to_string(worker.rank)},
      {"ROLE_NAME", job.role},
      {"LOCAL_WORLD_SIZE", std::to_string(job.local_world_size)},
      {"WORLD_SIZE", std::to_string(job.world_size)},
      {"GROUP_WORLD_SIZE", std::to_string(job.group_world_size)},
      {"ROLE_WORLD_SIZE", std::to_string(job.world_size)},
      {"MASTER_ADDR", job.master_addr},
      {"MASTER_PORT", std::to_string(job.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(job.max_restarts)},
      {"TORCHELASTIC_RUN_ID", job.run_id},
      {"TORCHELASTIC_SIGNALS_TO_HANDLE", job.signals_to_handle},
      // mcprun hosts the job store at MASTER_ADDR:MASTER_PORT, so it sees the init barrier.
      {"TORCHELASTIC_USE_AGENT_STORE", "True"},
      {kInitBarrierVariable, inherited_or(kInitBarrierVariable, "1")},
      // A stalled worker then prints every thread's Python traceback on SIGABRT; "" opts out.
      {"PYTHONFAULTHANDLER", inherited_or("PYTHONFAULTHANDLER", "1")},
      {"TORCHELASTIC_ERROR_FILE", error_file},
      // As that torch's torchrun: its own name, kept if exported; the other name passes through.
      {job.nccl_async_error_handling, inherited_or(job.nccl_async_error_handling.c_str(), "1")},
  };
  if (!inherited.contains("OMP_NUM_THREADS") && job.local_world_size > 1)
    env["OMP_NUM_THREADS"] = "1";
  if (!worker.visible_gpus.empty()) {
    std::string visible;
    for (const auto& gpu : worker.visible_gpus) visible += (visible.empty() ? "" : ",") + gpu;
    env["CUDA_VISIBLE_DEVICES"] = visible;
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";  // Makes an index mean the PCI order we sorted by.
  }
  return env;
}

std::vector<std::string> merge_environment(const Environment& inherited, const Environment& delta) {
  Environment merged;
  // Stale launcher variables (an outer torchrun's, say) must not leak into a worker.
  for (const auto& [name, value] : inherited)
    if (!owned_by_launcher(name)) merged.emplace(name, value);
  for (const auto& [name, value] : delta) merged[name] = value;
  std::vector<std::string> entries;
  entries.reserve(merged.size());
  for (const auto& [name, value] : merged) entries.push_back(name + "=" + value);
  return entries;
}

std::vector<std::string> environment_warnings(const JobIdentity& job,
                                              const Environment& inherited) {
  std::vector<std::string> warnings;
  WorkerIdentity first;
  first.rank = job.group_rank * job.local_world_size;
  Environment ours = worker_env_delta(job, first, 0, "", inherited);
  for (const auto& [name, value] : inherited) {
    if (!owned_by_launcher(name)) continue;
    std::string replacement;
    if (is_per_worker(name)) {
      replacement = "mcprun's per-worker value";
    } else if (auto it = ours.find(name); it != ours.end()) {
      if (it->second == value) continue;
      replacement = "'" + it->second + "'";
    } else {
      replacement = "nothing (mcprun does not set it)";
    }
    warnings.push_back("inherited " + name + "='" + value + "' is replaced by " + replacement +
                       ": mcprun owns the process group's environment");
  }
  if (!inherited.contains("OMP_NUM_THREADS") && job.local_world_size > 1)
    warnings.push_back(
        "OMP_NUM_THREADS is set to 1 for each worker to avoid oversubscribing "
        "the CPUs; set it yourself to tune it");
  return warnings;
}

}  // namespace mcprun
