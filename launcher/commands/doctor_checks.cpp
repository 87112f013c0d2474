// The checks of mcprun doctor: pure functions of DoctorInputs and what DoctorProbes answer.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/exit_status.hpp"
#include "common/sys.hpp"
#include "common/topology.hpp"
#include "launcher/commands/doctor.hpp"
#include "launcher/commands/doctor_findings.hpp"
#include "launcher/config/slurm.hpp"

namespace mcprun {
namespace fs = std::filesystem;
using namespace doctor_findings;

std::string seconds_text(std::chrono::milliseconds limit) {
  return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(limit).count());
}

namespace {

/// NCCL's shared-memory segments stall at docker's 64 MB; the remedy names both ways to grow it.
constexpr const char* kShmRemedy =
    "docker: run with --ipc=host or --shm-size=8g (Kubernetes: an emptyDir with medium: Memory "
    "mounted at /dev/shm); a host: mount -o remount,size=8G /dev/shm";

std::optional<long> parse_long(std::string_view text) {
  long value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

/// "1,0": indices, unlike UUIDs, name a different card under each CUDA_DEVICE_ORDER.
bool names_gpus_by_index(const std::string& visible) {
  auto items = split(visible, ',');
  return std::any_of(items.begin(), items.end(),
                     [](const std::string& item) { return parse_long(item).has_value(); });
}

/// When an inherited variable has the effect its table row describes.
enum class Trigger { kAnyValue, kNonZero, kZero };

/// One inherited variable that changes how NCCL, torch or CUDA behave, and what to do about it.
struct KnownVariable {
  std::string_view name;
  Trigger trigger;
  CheckStatus status;
  std::string_view effect;
  std::string_view remedy;
};

/// Every variable the environment check explains, in one place.
constexpr KnownVariable kKnownVariables[] = {
    {"NCCL_P2P_DISABLE", Trigger::kNonZero, CheckStatus::kWarn,
     "GPU peer-to-peer off; all-reduce goes through host memory, several times slower",
     "unset it unless P2P is broken on this box (then fix the cause: IOMMU/ACS settings, a PCIe "
     "switch); it is a probe, not a setting to keep"},
    {"NCCL_P2P_LEVEL", Trigger::kAnyValue, CheckStatus::kOk,
     "NCCL uses peer-to-peer only up to this GPU-to-GPU distance (LOC turns it off)", ""},
    {"NCCL_SHM_DISABLE", Trigger::kNonZero, CheckStatus::kWarn,
     "shared-memory transport off; GPUs without a P2P path exchange data over sockets, far slower",
     "unset it once /dev/shm is large enough (see the shm check)"},
    {"NCCL_IB_DISABLE", Trigger::kNonZero, CheckStatus::kWarn,
     "InfiniBand/RoCE off; NCCL sends inter-node traffic over TCP sockets instead",
     "unset it to let NCCL use the InfiniBand adapters found here"},
    {"NCCL_NET_GDR_LEVEL", Trigger::kAnyValue, CheckStatus::kOk,
     "GPUDirect RDMA only up to this GPU-to-NIC distance; beyond it data is staged through host "
     "memory",
     ""},
    {"NCCL_DEBUG", Trigger::kAnyValue, CheckStatus::kOk,
     "NCCL logs at this level on every rank (INFO: its setup, rings and transports)", ""},
    {"NCCL_DEBUG_SUBSYS", Trigger::kAnyValue, CheckStatus::kOk, "the NCCL subsystems logged", ""},
    {"NCCL_ALGO", Trigger::kAnyValue, CheckStatus::kOk,
     "forces NCCL's collective algorithm; its own tuning is off", ""},
    {"NCCL_PROTO", Trigger::kAnyValue, CheckStatus::kOk,
     "forces NCCL's protocol; its own tuning is off", ""},
    {"NCCL_ASYNC_ERROR_HANDLING", Trigger::kZero, CheckStatus::kWarn,
     "a failed or timed-out collective no longer aborts the rank: the job hangs instead of failing",
     "unset it (mcprun then sets 1)"},
    {"TORCH_NCCL_ASYNC_ERROR_HANDLING", Trigger::kZero, CheckStatus::kWarn,
     "a failed or timed-out collective no longer aborts the rank: the job hangs instead of failing",
     "unset it (mcprun then sets 1)"},
    {"NCCL_BLOCKING_WAIT", Trigger::kNonZero, CheckStatus::kOk,
     "the host waits for every collective and raises on its timeout", ""},
    {"TORCH_NCCL_BLOCKING_WAIT", Trigger::kNonZero, CheckStatus::kOk,
     "the host waits for every collective and raises on its timeout", ""},
    {"TORCH_DISTRIBUTED_DEBUG", Trigger::kAnyValue, CheckStatus::kOk,
     "torch checks and logs every collective (DETAIL: slower, for diagnosis)", ""},
    {"CUDA_LAUNCH_BLOCKING", Trigger::kNonZero, CheckStatus::kWarn,
     "every CUDA kernel launch waits for the kernel to finish: a debugging setting, much slower",
     "unset it outside debugging"},
};

bool triggered(Trigger trigger, const std::string& value) {
  switch (trigger) {
    case Trigger::kAnyValue:
      return true;
    case Trigger::kNonZero:
      return parse_long(value).value_or(0) != 0;
    case Trigger::kZero:
      return value == "0";
  }
  return false;
}

/// The GT/s number of "16.0 GT/s PCIe"; nullopt for "Unknown" or garbage.
std::optional<double> link_speed_gts(const std::string& text) {
  try {
    size_t used = 0;
    double value = std::stod(text, &used);
    return used > 0 && value > 0 ? std::optional<double>(value) : std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

/// "16.0 GT/s PCIe" -> "16.0 GT/s".
std::string short_speed(const std::string& text) {
  auto suffix = text.find(" PCIe");
  return suffix == std::string::npos ? text : text.substr(0, suffix);
}

}  // namespace

const char* status_name(CheckStatus status) {
  switch (status) {
    case CheckStatus::kOk:
      return "OK";
    case CheckStatus::kWarn:
      return "WARN";
    case CheckStatus::kFail:
      return "FAIL";
  }
  return "?";
}

// --- The checks -------------------------------------------------------------------------------

CheckResult check_shm(const DoctorInputs& inputs, DoctorProbes& probes) {
  const std::string path = inputs.shm_path.string();
  auto measured = probes.filesystem_space(inputs.shm_path);
  if (!measured)
    return fail("shm", measured.error().message + ": NCCL keeps its shared-memory segments there",
                std::string("mount a tmpfs there (mount -t tmpfs -o size=8G tmpfs /dev/shm); ") +
                    kShmRemedy);
  const FilesystemSpace& space = *measured;
  if (space.total_bytes == 0)  // A tmpfs mounted with size=0 has no limit and reports none.
    return warn("shm", path + " reports no size: it may be unlimited, or not a tmpfs at all",
                "check what is mounted there (findmnt " + path + ")");
  const std::string sizes = path + ": " + human_bytes(static_cast<double>(space.available_bytes)) +
                            " free of " + human_bytes(static_cast<double>(space.total_bytes));
  // Free space is what NCCL can use; a large but full /dev/shm holds a killed job's segments.
  const bool large_but_full = space.total_bytes >= kShmWarnBelowBytes;
  const std::string remedy = large_but_full
                                 ? "remove the stale segments of killed jobs (ls -la " + path + ")"
                                 : std::string(kShmRemedy);
  if (space.available_bytes < kShmFailBelowBytes)
    return fail("shm",
                sizes + ", below " + human_bytes(static_cast<double>(kShmFailBelowBytes)) +
                    ": NCCL's shared-memory transport stalls when it runs out",
                remedy);
  if (space.available_bytes < kShmWarnBelowBytes)
    return warn("shm",
                sizes + ", below " + human_bytes(static_cast<double>(kShmWarnBelowBytes)) +
                    ": enough for a few GPUs, tight for 8",
                remedy);
  return ok("shm", sizes);
}

namespace {

/// A variable mcprun sets for its workers, inherited from outside: the worker gets mcprun's.
CheckResult check_launcher_variable(const std::string& name, const std::string& variable,
                                    const std::string& shown) {
  std::string remedy =
      "unset it where it comes from (an outer torchrun, a wrapper framework, a job script): "
      "two parties setting up one process group hang it";
  if (variable == "MASTER_ADDR" || variable == "MASTER_PORT")
    remedy += "; meant for mcprun? pass --" +
              std::string(variable == "MASTER_ADDR" ? "master-addr" : "master-port");
  return warn(name, "inherited " + shown + ": mcprun replaces it for every worker", remedy);
}

/// CUDA_VISIBLE_DEVICES: empty, or indices that CUDA reads in another order than nvidia-smi.
CheckResult check_cuda_visible_devices(const std::string& name, const std::string& value,
                                       const std::string& shown, const Environment& env) {
  const auto order = env.find("CUDA_DEVICE_ORDER");
  const bool pci_order = order != env.end() && order->second == "PCI_BUS_ID";
  if (split(value, ',').empty())
    return warn(name, "CUDA_VISIBLE_DEVICES is empty: CUDA sees no GPU at all",
                "unset it, or name the GPUs to use");
  if (names_gpus_by_index(value) && !pci_order)
    return warn(
        name,
        shown +
            " without CUDA_DEVICE_ORDER=PCI_BUS_ID: indices then follow CUDA's fastest-first "
            "order, not nvidia-smi's (PCI) order, so an index may name another card",
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID, or name the GPUs by UUID (nvidia-smi -L); mcprun "
        "reads the indices in PCI order and sets both for its workers");
  return ok(name, shown + ": mcprun pins its workers within these GPUs");
}

/// NCCL_SOCKET_IFNAME: NCCL's own matching (prefixes, '=', '^') must find an interface here.
CheckResult check_nccl_socket_ifname(const std::string& name, const std::string& value,
                                     const std::string& shown,
                                     const std::vector<std::string>& interfaces) {
  std::vector<std::string> matched;
  for (const std::string& interface : interfaces)
    if (nccl_interface_matches(value, interface)) matched.push_back(interface);
  if (matched.empty())
    return warn(name, shown + ": no interface here matches, so NCCL finds no socket interface",
                "name an interface that exists (ip -br link): NCCL takes prefixes, '=' "
                "for exact names, a leading '^' to exclude");
  return ok(name, shown + ": NCCL's sockets use only " + join(matched, ", "));
}

/// GLOO_SOCKET_IFNAME: every interface it names must exist here. The interfaces are listed only
/// if it names one.
CheckResult check_gloo_socket_ifname(
    const std::string& name, const std::string& value, const std::string& shown,
    const std::function<const std::vector<std::string>&()>& interface_names) {
  std::vector<std::string> missing;
  for (const std::string& interface : split(value, ','))
    if (std::find(interface_names().begin(), interface_names().end(), interface) ==
        interface_names().end())
      missing.push_back(interface);
  if (!missing.empty())
    return warn(name,
                shown + ": no interface " + join(missing, ", ") + " here; Gloo fails to start",
                "name an interface that exists (ip -br link)");
  return ok(name, shown + ": Gloo's sockets use this interface");
}

/// The table's findings for `variable`: what setting it to `value` does to NCCL or torch.
void check_known_variable(const std::string& name, const std::string& variable,
                          const std::string& value, const std::string& shown,
                          const fs::path& sysfs_root, std::vector<CheckResult>& results) {
  for (const KnownVariable& known : kKnownVariables) {
    if (variable != known.name || !triggered(known.trigger, value)) continue;
    CheckResult result{name, known.status, shown + ": " + std::string(known.effect),
                       std::string(known.remedy)};
    // Without an adapter, turning InfiniBand off changes nothing.
    if (variable == "NCCL_IB_DISABLE" && !has_infiniband(sysfs_root)) {
      result.status = CheckStatus::kOk;
      result.finding += " (no InfiniBand adapter here: no effect)";
    }
    if (result.status == CheckStatus::kOk) result.remedy.clear();
    results.push_back(std::move(result));
  }
}

}  // namespace

std::vector<CheckResult> check_environment(const DoctorInputs& inputs, DoctorProbes& probes) {
  const std::string name = "environment";
  std::vector<CheckResult> results;
  std::optional<std::vector<std::string>> interfaces;  // Listed only when a variable names one.
  auto interface_names = [&]() -> const std::vector<std::string>& {
    if (!interfaces) interfaces = probes.interface_names();
    return *interfaces;
  };
  for (const auto& [variable, value] : inputs.env) {
    const std::string shown = variable + "=" + value;
    if (owned_by_launcher(variable) && variable != kLogLinePrefixTemplateVariable)
      results.push_back(check_launcher_variable(name, variable, shown));
    else if (variable == "CUDA_VISIBLE_DEVICES")
      results.push_back(check_cuda_visible_devices(name, value, shown, inputs.env));
    else if (variable == "NCCL_SOCKET_IFNAME")
      results.push_back(check_nccl_socket_ifname(name, value, shown, interface_names()));
    else if (variable == "GLOO_SOCKET_IFNAME")
      results.push_back(check_gloo_socket_ifname(name, value, shown, interface_names));
    else
      check_known_variable(name, variable, value, shown, inputs.sysfs_root, results);
  }
  if (results.empty())
    results.push_back(ok(name, "no inherited variable fights mcprun or changes NCCL"));
  return results;
}

std::vector<CheckResult> check_gpus(const DoctorInputs& inputs) {
  const std::string name = "gpus";
  const std::vector<GpuDevice> gpus = discover_gpus(inputs.sysfs_root);
  if (gpus.empty()) return {ok(name, "no NVIDIA GPU found; workers run on CPU")};
  std::vector<CheckResult> results;
  std::vector<std::string> listed, unknown_numa;
  std::set<int> numa_nodes;
  for (const GpuDevice& gpu : gpus) {
    listed.push_back(gpu.bus_id + " (NUMA " +
                     (gpu.numa_node < 0 ? "?" : std::to_string(gpu.numa_node)) + ")");
    if (gpu.numa_node < 0)
      unknown_numa.push_back(gpu.bus_id);
    else
      numa_nodes.insert(gpu.numa_node);
  }
  std::string summary = std::to_string(gpus.size()) + " GPU" + (gpus.size() == 1 ? "" : "s") +
                        ": " + join(listed, ", ");
  if (numa_nodes.size() > 1) {
    std::vector<std::string> nodes;
    for (int node : numa_nodes) nodes.push_back(std::to_string(node));
    summary += "; they span NUMA nodes " + join(nodes, ", ") +
               ": --bind numa keeps each worker's host memory next to its GPU";
  }
  results.push_back(ok(name, summary));
  if (!unknown_numa.empty())
    results.push_back(
        warn(name,
             "no NUMA affinity known for " + join(unknown_numa, ", ") +
                 " (numa_node -1): --bind numa cannot place their workers",
             "normal on a single-socket box; on a multi-socket one enable NUMA in the "
             "BIOS (and check that the kernel sees an ACPI SRAT)"));
  for (const GpuDevice& gpu : gpus) {
    std::vector<std::string> below;
    std::vector<std::string> remedies;
    if (gpu.link_width > 0 && gpu.max_link_width > 0 && gpu.link_width < gpu.max_link_width) {
      below.push_back("x" + std::to_string(gpu.link_width) + " of x" +
                      std::to_string(gpu.max_link_width));
      remedies.push_back(
          "an x8 slot, a riser or a lane-sharing BIOS setting cuts its host bandwidth: "
          "move it to a full-width slot, or check the slot's bifurcation setting");
    }
    auto speed = link_speed_gts(gpu.link_speed), max_speed = link_speed_gts(gpu.max_link_speed);
    if (speed && max_speed && *speed < *max_speed) {
      below.push_back(short_speed(gpu.link_speed) + " of " + short_speed(gpu.max_link_speed));
      remedies.push_back(
          "an idle GPU lowers its link speed to save power: recheck under load "
          "(nvidia-smi -q -d PCIE); if it stays low, the slot, a riser or the BIOS's "
          "PCIe generation setting limits it");
    }
    if (!below.empty())
      results.push_back(
          warn(name, "GPU " + gpu.bus_id + " runs at " + join(below, ", "), join(remedies, "; ")));
  }
  return results;
}

CheckResult check_memlock(const DoctorInputs& inputs) {
  if (!inputs.memlock_bytes) return ok("memlock", "locked memory is unlimited (what RDMA needs)");
  const bool infiniband = has_infiniband(inputs.sysfs_root);
  return warn(
      "memlock",
      "locked memory is limited to " + human_bytes(static_cast<double>(*inputs.memlock_bytes)) +
          " (ulimit -l " + std::to_string(*inputs.memlock_bytes / 1024) +
          "): InfiniBand/RDMA pins memory, and NCCL over IB fails or falls back to sockets" +
          (infiniband ? "" : " (no InfiniBand adapter here yet)"),
      "ulimit -l unlimited before starting mcprun; systemd: LimitMEMLOCK=infinity; docker: "
      "--ulimit memlock=-1; /etc/security/limits.conf: '* - memlock unlimited'");
}

std::vector<CheckResult> check_nccl(const DoctorInputs& inputs, DoctorProbes& probes) {
  const std::string name = "nccl";
  if (inputs.python.empty()) return {};
  auto probed = probes.torch_nccl(inputs.python, inputs.env);
  if (!probed)
    return {warn(name,
                 "cannot ask " + inputs.python + " for torch's NCCL: " + probed.error().message,
                 "set PYTHON_EXEC to the interpreter the workers run (a venv's python), or "
                 "pass --no-torch to skip this check")};
  const TorchNccl& torch = *probed;
  const std::string build = "torch " + torch.torch_version;
  if (torch.cuda_version.empty()) return {ok(name, build + " is a CPU build: no NCCL (gloo only)")};
  const std::string from =
      torch.libraries.empty() ? " (linked into torch)" : " from " + join(torch.libraries, ", ");
  if (!torch.load_error.empty() || torch.loaded.empty())
    return {warn(
        name,
        build + " (CUDA " + torch.cuda_version + ") cannot report its NCCL: " + torch.load_error,
        "NCCL fails to load: check that libnccl.so.2 is found (ldd on torch's libtorch_cuda.so)")};
  if (torch.libraries.size() > 1)
    return {warn(
        name,
        build + " has " + std::to_string(torch.libraries.size()) + " NCCL libraries mapped" + from,
        "two NCCLs in one process (LD_PRELOAD, or a system copy beside torch's): keep only "
        "torch's")};
  if (!torch.shipped.empty() && torch.shipped != torch.loaded)
    return {warn(
        name, build + " ships with NCCL " + torch.shipped + " but runs NCCL " + torch.loaded + from,
        "a different NCCL (LD_LIBRARY_PATH or LD_PRELOAD) is a known cause of silent hangs: drop "
        "it from those variables, or run the same NCCL on every node on purpose")};
  return {ok(name, build + " (CUDA " + torch.cuda_version + ") runs NCCL " + torch.loaded + from +
                       (torch.shipped.empty() ? "" : ", the version it ships with"))};
}

std::optional<std::string> DoctorProbes::slurm_node_address(const std::string& node) {
  return resolve_slurm_host(node);
}

std::vector<CheckResult> check_slurm(const DoctorInputs& inputs, DoctorProbes& probes) {
  const std::string name = "slurm";
  auto detected = detect_slurm_step(inputs.env);
  if (!detected)
    return {
        fail(name, detected.error().message + ": mcprun would refuse to start (exit 2)",
             "start it as srun --ntasks-per-node=1 mcprun ..., or ignore Slurm with --no-slurm")};
  const std::optional<SlurmStep>& step = *detected;
  if (!step) {
    auto job = inputs.env.find("SLURM_JOB_ID");
    auto off = inputs.env.find("MCPRUN_SLURM");
    if (job == inputs.env.end() || job->second.empty() ||
        (off != inputs.env.end() && off->second == "0"))
      return {};
    // The batch script's shell has the job but no step: mcprun there is one node on its own.
    return {warn(name,
                 "Slurm job " + job->second +
                     ", but outside a step (the batch script or salloc's shell): mcprun would take "
                     "nothing from Slurm here and start this node's workers alone",
                 "start it on every node with srun --ntasks-per-node=1 mcprun ...")};
  }
  const std::string where = "Slurm job " + step->job_id + " step " + step->step_id + ", node " +
                            std::to_string(step->node_id) + " of " + std::to_string(step->nnodes);
  const std::string port = std::to_string(step->master_port());
  std::vector<std::string> taken = {"nnodes " + std::to_string(step->nnodes),
                                    "node rank " + std::to_string(step->node_id)};
  std::optional<std::string> address;
  if (!step->hosts.empty()) {
    const std::string& first = step->hosts.front();
    const FirstAddress found = first_address(first, probes);
    address = found.error.empty() ? std::optional(found.address) : probes.slurm_node_address(first);
    taken.push_back("master " + first + " (" + address.value_or("no address") + ") port " + port);
  }
  taken.push_back("run id " + step->run_id());
  taken.push_back("GPUs " + step->gpus.value_or("none"));
  std::vector<CheckResult> results = {
      ok(name, where + ": mcprun takes " + join(taken, ", ") +
                   " (with --rdzv-backend c10d node 0 hosts the rendezvous at that address and "
                   "port; a flag or PET_* variable wins over Slurm)")};
  if (step->max_tasks_per_node > 1)
    results.push_back(warn(name,
                           "Slurm started " + std::to_string(step->max_tasks_per_node) +
                               " tasks on one node: mcprun refuses to start (exit 2), since each "
                               "task would start every worker",
                           "run one task per node: srun --ntasks-per-node=1 mcprun ... (or "
                           "--no-slurm)"));
  if (step->hosts.empty()) return results;
  const std::string& first = step->hosts.front();
  if (!address) {
    results.push_back(fail("slurm-master",
                           "Slurm's first node " + first +
                               " resolves to no address (getaddrinfo, scontrol show node): mcprun "
                               "would refuse to start",
                           "add " + first +
                               " to /etc/hosts or DNS, or give --master-addr (or "
                               "--rdzv-endpoint) yourself"));
    return results;
  }
  // The master-port check, aimed where Slurm points mcprun: a bind on node 0, a connect elsewhere.
  DoctorInputs master = inputs;
  master.master_addr = *address;
  master.master_port = port;
  for (CheckResult result : check_master_port(master, probes)) {
    result.name = "slurm-master";
    result.finding = "first node " + first + ": " + result.finding;
    results.push_back(std::move(result));
  }
  return results;
}

std::vector<CheckResult> run_checks(const DoctorInputs& inputs, DoctorProbes& probes) {
  std::vector<CheckResult> results;
  auto append = [&](std::vector<CheckResult> more) {
    for (CheckResult& result : more) results.push_back(std::move(result));
  };
  results.push_back(check_shm(inputs, probes));
  results.push_back(check_interface(inputs, probes));
  append(check_master_port(inputs, probes));
  append(check_rdzv_endpoint(inputs, probes));
  append(check_slurm(inputs, probes));
  append(check_environment(inputs, probes));
  append(check_gpus(inputs));
  results.push_back(check_memlock(inputs));
  results.push_back(check_hostname(inputs, probes));
  append(check_clock(inputs, probes));
  append(check_nccl(inputs, probes));
  return results;
}

int doctor_exit_code(const std::vector<CheckResult>& results) {
  return std::any_of(results.begin(), results.end(),
                     [](const CheckResult& r) { return r.status == CheckStatus::kFail; })
             ? kExitFailure
             : kExitSuccess;
}

}  // namespace mcprun
