#include "launcher/plan/rank_plan.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <thread>

#include "common/sys.hpp"
#include "launcher/plan/torch_version.hpp"

namespace mcprun {
namespace {

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : separator) + item;
  return text;
}

std::string format_cpus(const std::vector<int>& cpus) {
  return cpus.empty() ? "inherited" : format_cpulist(cpus);
}

std::string describe_gpu(const GpuDevice& gpu) {
  std::string text = gpu.bus_id + " (index " + std::to_string(gpu.pci_index) + ", numa " +
                     std::to_string(gpu.numa_node);
  if (!gpu.switch_id().empty()) text += ", under " + gpu.switch_id();
  if (!gpu.uuid.empty()) text += ", " + gpu.uuid;
  return text + ")";
}

std::string quote_arg(const std::string& arg) {
  if (!arg.empty() && arg.find_first_of(" \t\n'\"\\$`") == std::string::npos) return arg;
  std::string quoted = "'";
  for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace

std::string worker_python(const Environment& env, const std::filesystem::path& launcher) {
  auto exec = env.find("PYTHON_EXEC");
  if (exec != env.end() && !exec->second.empty()) return exec->second;
  std::error_code ec;
  const auto prefix = launcher.parent_path().parent_path();
  const bool python_environment = std::filesystem::exists(prefix / "pyvenv.cfg", ec) ||
                                  std::filesystem::is_directory(prefix / "conda-meta", ec);
  const auto beside = launcher.parent_path() / "python3";
  if (python_environment && std::filesystem::exists(beside, ec)) return beside.string();
  return "python3";
}

namespace {

/// --nproc-per-node as a count: cpu, gpu and auto resolved against what this node has.
Expected<int> resolve_nproc(const NprocSpec& spec, int gpu_count) {
  const int cpu_count = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  switch (spec.kind) {
    case NprocSpec::Kind::kCount:
      return spec.count;
    case NprocSpec::Kind::kCpu:
      return cpu_count;
    case NprocSpec::Kind::kGpu:
      if (gpu_count == 0)
        return Error{"--nproc-per-node gpu: no NVIDIA GPU found (use a count, cpu or auto)"};
      return gpu_count;
    case NprocSpec::Kind::kAuto:
      return gpu_count > 0 ? gpu_count : cpu_count;
  }
  return spec.count;
}

/// The workers' command line: the script (or module, or executable) through Python unless
/// --no-python, with its arguments. An error when the script or interpreter is not there.
Expected<std::vector<std::string>> worker_argv(const LaunchConfig& config,
                                               const Environment& inherited) {
  if (!config.module) {
    if (config.no_python) {
      if (!find_executable(config.script, search_path_of(inherited)))
        return Error{"executable not found: " + config.script};
    } else if (!std::filesystem::is_regular_file(config.script)) {
      return Error{"training script not found: " + config.script};
    }
  }
  std::vector<std::string> argv;
  if (config.no_python) {
    argv.push_back(config.script);
  } else {
    const std::string python = worker_python(inherited);
    auto resolved = find_executable(python, search_path_of(inherited));
    if (!resolved) return Error{"python interpreter not found: " + python + " (set PYTHON_EXEC)"};
    argv = {*resolved, "-u"};  // Unbuffered, as torchrun runs it, so output is live.
    if (config.module) argv.push_back("-m");
    argv.push_back(config.script);
  }
  argv.insert(argv.end(), config.script_args.begin(), config.script_args.end());
  return argv;
}

/// The torch the workers' interpreter imports: the one in their command line, or under
/// --no-python the one PYTHON_EXEC (else python3) names, which a wrapper script most likely runs.
std::optional<TorchVersion> workers_torch(const LaunchConfig& config,
                                          const std::vector<std::string>& argv,
                                          const Environment& inherited) {
  std::optional<std::string> interpreter =
      config.no_python ? find_executable(worker_python(inherited), search_path_of(inherited))
                       : std::optional<std::string>(argv.front());
  if (!interpreter) return std::nullopt;
  return installed_torch_version(python_package_dirs(*interpreter, inherited));
}

/// One slot per local rank: its global rank and, when pinned, its GPU and the GPUs it sees.
std::vector<RankSlot> rank_slots(const LaunchConfig& config, const TopologyOrder& order, int nproc,
                                 int group_rank, bool pinned) {
  // Every worker sees the job's GPUs in topology order, so cuda:LOCAL_RANK is the GPU chosen for
  // that rank and set_device(LOCAL_RANK) works unchanged; GPUs beyond nproc stay hidden.
  std::vector<std::string> job_gpus;
  if (pinned)
    for (int local_rank = 0; local_rank < nproc; ++local_rank)
      job_gpus.push_back(order.gpus[local_rank].cuda_visible_name());
  std::vector<RankSlot> slots;
  for (int local_rank = 0; local_rank < nproc; ++local_rank) {
    RankSlot slot;
    slot.identity.local_rank = local_rank;
    slot.identity.rank = group_rank * nproc + local_rank;
    if (pinned) {
      slot.identity.gpu = order.gpus[local_rank];
      slot.identity.visible_gpus =
          config.virtual_local_rank ? std::vector<std::string>{job_gpus[local_rank]} : job_gpus;
      if (config.bind == LaunchConfig::CpuBind::kNuma)
        slot.cpus = order.gpus[local_rank].local_cpus;
    }
    slots.push_back(std::move(slot));
  }
  return slots;
}

/// --numa-binding: each pinned slot's CPUs near its GPU, in torch 2.x's mode.
Expected<void> bind_numa(const LaunchConfig& config, const TopologyOrder& order, RankPlan& plan) {
  if (config.numa_binding && plan.pinned) {
    const CpuTopology cpus = read_cpu_topology();
    for (RankSlot& slot : plan.slots) {
      auto bound = numa_binding_cpus(*config.numa_binding, *slot.identity.gpu, order.gpus, cpus);
      if (!bound)
        return Error{"--numa-binding " + std::string(to_string(*config.numa_binding)) +
                     ": local rank " + std::to_string(slot.identity.local_rank) + ": " +
                     bound.error().message};
      slot.cpus = std::move(*bound);
    }
  } else if (config.numa_binding) {
    plan.warnings.push_back("--numa-binding has no effect without pinned GPUs");
  }
  return {};
}

/// Warnings for flags without effect here and for inherited variables; --nccl-debug's variables.
void finish_plan(const LaunchConfig& config, const Environment& inherited, RankPlan& plan) {
  if (config.virtual_local_rank && !plan.pinned)
    plan.warnings.push_back(
        "--virtual-local-rank sets LOCAL_RANK=0 for every worker of an "
        "unpinned job: ranks on one node can no longer tell their GPU apart");
  if (config.bind == LaunchConfig::CpuBind::kNuma && !plan.pinned)
    plan.warnings.push_back("--bind numa has no effect without pinned GPUs");
  plan.nccl_log_files = config.nccl_debug;
  if (config.nccl_debug)
    plan.extra_env.insert({{"NCCL_DEBUG", "INFO"},
                           {"NCCL_DEBUG_SUBSYS", "INIT,NET"},
                           {"TORCH_DISTRIBUTED_DEBUG", "DETAIL"}});
  auto env_warnings = environment_warnings(plan.job, inherited);
  plan.warnings.insert(plan.warnings.end(), env_warnings.begin(), env_warnings.end());
}

}  // namespace

Expected<RankPlan> build_rank_plan(const LaunchConfig& config, std::vector<GpuDevice> discovered,
                                   const Environment& inherited, int master_port) {
  RankPlan plan;
  plan.warnings = config.warnings;

  // The user's allowed set: --gpus wins over an inherited CUDA_VISIBLE_DEVICES.
  std::optional<std::string> allowed = config.gpus;
  if (!allowed)
    if (auto it = inherited.find("CUDA_VISIBLE_DEVICES"); it != inherited.end())
      allowed = it->second;
  TopologyOrder order = topology_order(std::move(discovered), allowed);
  if (!order.error.empty())
    return Error{(config.gpus ? "--gpus: " : "CUDA_VISIBLE_DEVICES: ") + order.error};
  const int gpu_count = static_cast<int>(order.gpus.size());

  auto resolved = resolve_nproc(config.nproc, gpu_count);
  if (!resolved) return resolved.error();
  const int nproc = *resolved;

  // `-n cpu` asks for a CPU job; no GPU at all is a CPU job too, and not an error.
  plan.pinned = !config.no_pin && gpu_count > 0 && config.nproc.kind != NprocSpec::Kind::kCpu;
  if (plan.pinned && nproc > gpu_count)
    return Error{std::to_string(nproc) + " GPU-pinned ranks but only " + std::to_string(gpu_count) +
                 " GPU(s) allowed; lower --nproc-per-node or pass --no-pin to share GPUs"};

  auto argv = worker_argv(config, inherited);
  if (!argv) return argv.error();
  plan.argv = std::move(*argv);

  // A static multi-node job knows its place from the flags; a rendezvous moves it later.
  const int group_rank = config.uses_rendezvous() ? 0 : config.node_rank.value_or(0);
  const int group_world_size = config.uses_rendezvous() ? 1 : config.max_nodes;
  plan.job = JobIdentity{config.master_addr,
                         master_port,
                         config.rdzv_id,
                         config.role,
                         config.max_restarts,
                         nproc,
                         nproc * group_world_size,
                         group_rank,
                         group_world_size,
                         config.virtual_local_rank,
                         format_signal_list(config.signals_to_handle)};
  plan.torch = workers_torch(config, plan.argv, inherited);
  plan.job.nccl_async_error_handling = nccl_async_error_handling_variable(plan.torch);
  plan.slots = rank_slots(config, order, nproc, group_rank, plan.pinned);
  if (auto bound = bind_numa(config, order, plan); !bound) return bound.error();
  finish_plan(config, inherited, plan);
  return plan;
}

std::optional<std::string> interface_for_address(const std::string& local_address) {
  ifaddrs* list = nullptr;
  if (local_address.empty() || ::getifaddrs(&list) != 0) return std::nullopt;
  std::optional<std::string> found;
  for (ifaddrs* entry = list; entry && !found; entry = entry->ifa_next) {
    if (!entry->ifa_addr) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const int family = entry->ifa_addr->sa_family;
    if (family == AF_INET)
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr, text,
                  sizeof text);
    else if (family == AF_INET6)
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(entry->ifa_addr)->sin6_addr, text,
                  sizeof text);
    if (local_address == text) found = entry->ifa_name;
  }
  ::freeifaddrs(list);
  return found;
}

void set_socket_interface(RankPlan& plan, const std::string& interface,
                          const Environment& inherited) {
  for (const char* name : {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"})
    if (!inherited.contains(name)) plan.extra_env[name] = interface;
}

void place_in_job(RankPlan& plan, const JobPlacement& placement) {
  plan.job.group_rank = placement.group_rank;
  plan.job.group_world_size = placement.group_world_size;
  plan.job.world_size = placement.world_size;
  plan.job.master_addr = placement.master_addr;
  plan.job.master_port = placement.master_port;
  for (RankSlot& slot : plan.slots)
    slot.identity.rank = placement.rank_offset + slot.identity.local_rank;
}

std::filesystem::path timer_file_in(const std::filesystem::path& runtime_dir) {
  return runtime_dir / "timer.fifo";
}

std::filesystem::path agent_socket_in(const std::filesystem::path& runtime_dir) {
  return runtime_dir / "agent.sock";
}

std::optional<std::filesystem::path> python_helper_dir() {
  const auto exe = self_executable();
  if (exe.empty()) return std::nullopt;
  std::error_code ec;
  auto dir = exe.parent_path().parent_path() / "share" / "mcprun" / "python";
  if (!std::filesystem::exists(dir / "mcprun" / "__init__.py", ec)) return std::nullopt;
  return dir;
}

void add_supervision_env(RankPlan& plan, const std::filesystem::path& runtime_dir,
                         bool collective_watch, const Environment& inherited) {
  plan.extra_env["TORCHELASTIC_TIMER_FILE"] = timer_file_in(runtime_dir).string();
  plan.extra_env["MCPRUN_AGENT_SOCKET"] = agent_socket_in(runtime_dir).string();
  if (collective_watch) plan.extra_env["MCPRUN_COLLECTIVE_WATCH"] = "1";
  if (auto helper = python_helper_dir()) {
    auto inherited_path = inherited.find("PYTHONPATH");
    plan.extra_env["PYTHONPATH"] =
        helper->string() + (inherited_path == inherited.end() ? "" : ":" + inherited_path->second);
  }
}

Environment worker_spawn_delta(const RankPlan& plan, const RankSlot& slot, int restart_count,
                               const std::filesystem::path& rank_dir, const Environment& inherited,
                               const StandIn* stand_in) {
  Environment delta = worker_env_delta(plan.job, slot.identity, restart_count,
                                       worker_error_file(rank_dir).string(), inherited);
  Environment job_wide = plan.extra_env;
  if (stand_in)
    for (const auto& [name, value] : stand_in->env) job_wide[name] = value;
  delta.insert(job_wide.begin(), job_wide.end());
  if (plan.nccl_log_files && !inherited.contains("NCCL_DEBUG_FILE"))
    delta["NCCL_DEBUG_FILE"] = nccl_log_pattern(rank_dir);
  if (plan.extra_env.contains("MCPRUN_COLLECTIVE_WATCH") &&
      !inherited.contains("TORCH_FR_DUMP_TEMP_FILE"))
    delta["TORCH_FR_DUMP_TEMP_FILE"] = flight_recorder_prefix(rank_dir.parent_path()).string();
  return delta;
}

std::string format_rank_plan(const RankPlan& plan, const Environment& inherited) {
  std::ostringstream out;
  out << "mcprun plan: " << plan.slots.size() << " worker(s), world size " << plan.job.world_size
      << ", master " << plan.job.master_addr << ":" << plan.job.master_port << ", run id "
      << plan.job.run_id << (plan.pinned ? ", GPU-pinned" : ", not pinned") << "\n";
  for (const RankSlot& slot : plan.slots) {
    const WorkerIdentity& worker = slot.identity;
    out << "local rank " << worker.local_rank << " (rank " << worker.rank << ")\n"
        << "  gpu:  " << (worker.gpu ? describe_gpu(*worker.gpu) : "none") << "\n"
        << "  cpus: " << format_cpus(slot.cpus) << "\n  env:\n";
    const auto rank_dir =
        std::filesystem::path(kDryRunDir) / "attempt_0" / std::to_string(worker.local_rank);
    for (const auto& [name, value] : worker_spawn_delta(plan, slot, 0, rank_dir, inherited))
      out << "    " << name << "=" << value << "\n";
    std::vector<std::string> quoted;
    for (const auto& arg : plan.argv) quoted.push_back(quote_arg(arg));
    out << "  argv: " << join(quoted, " ") << "\n";
  }
  return out.str();
}

std::string format_topology(const std::vector<GpuDevice>& discovered, const TopologyOrder& order) {
  std::ostringstream out;
  out << discovered.size() << " NVIDIA GPU(s) under " << sysfs_root().string() << "\n";
  for (const GpuDevice& gpu : discovered) {
    out << "  [" << gpu.pci_index << "] " << gpu.bus_id << "  numa " << gpu.numa_node << "  switch "
        << (gpu.switch_id().empty() ? "-" : gpu.switch_id()) << "  cpus "
        << format_cpus(gpu.local_cpus);
    if (gpu.max_link_width > 0) out << "  link x" << gpu.link_width << "/x" << gpu.max_link_width;
    out << "  uuid " << (gpu.uuid.empty() ? "- (not in the driver's /proc files)" : gpu.uuid)
        << "\n";
  }
  if (!order.error.empty()) out << "allowed set: " << order.error << "\n";
  out << "rank mapping (NUMA node, then PCIe switch, then bus id):\n";
  if (order.gpus.empty()) out << "  none: workers run unpinned on CPU\n";
  std::string visible;
  for (const GpuDevice& gpu : order.gpus)
    visible += (visible.empty() ? "" : ",") + gpu.cuda_visible_name();
  if (!order.gpus.empty()) out << "  every worker: CUDA_VISIBLE_DEVICES=" << visible << "\n";
  for (size_t rank = 0; rank < order.gpus.size(); ++rank)
    out << "  local rank " << rank << " -> cuda:" << rank << " = " << order.gpus[rank].bus_id
        << "\n";
  return out.str();
}

}  // namespace mcprun
