// GPU discovery from sysfs (UUIDs from the driver's /proc files) and the topology order that local
// ranks follow.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mcprun {

/// One NVIDIA GPU as seen on the PCI bus; enough to pin a worker to it and to order it.
struct GpuDevice {
  std::string bus_id;  ///< PCI address, lowercase "0000:3b:00.0".
  int pci_index = 0;   ///< Index in PCI bus order: what CUDA_DEVICE_ORDER=PCI_BUS_ID numbers it.
  int numa_node = -1;  ///< -1 when the kernel reports no NUMA affinity.
  std::vector<int> local_cpus;             ///< From local_cpulist; empty when unknown.
  std::vector<std::string> pci_parents;    ///< Bridges/switches above the GPU, root first.
  std::string uuid;                        ///< "GPU-..." from the driver; empty without one.
  int link_width = 0, max_link_width = 0;  ///< PCIe lanes now / at most (0 = unknown).
  std::string link_speed, max_link_speed;  ///< e.g. "16.0 GT/s PCIe" (empty = unknown).

  /// The switch a GPU hangs under: its nearest upstream bridge, which neighbours share.
  std::string switch_id() const;
  /// What CUDA_VISIBLE_DEVICES should name: the UUID when known, else the PCI index.
  std::string cuda_visible_name() const;
};

/// Where sysfs lives: $MCPRUN_SYSFS_ROOT (for fake trees in tests) or /sys.
std::filesystem::path sysfs_root();

/// All NVIDIA display/3D controllers under <root>/bus/pci/devices, sorted by bus id, with
/// pci_index set. Never throws for a missing or partial tree: it returns what it could read.
std::vector<GpuDevice> discover_gpus(const std::filesystem::path& sysfs = sysfs_root());

/// Where the driver's procfs files live: $MCPRUN_PROC_ROOT (for fake trees in tests) or /proc.
std::filesystem::path proc_root();

/// Fills each GPU's uuid from <proc>/driver/nvidia/gpus/<bus id>/information (its `GPU UUID:` and
/// `Bus Location:` lines), which the driver publishes without NVML: loading NVML would cost a
/// launch ~9 ms and ~18 MB. A GPU the driver does not list keeps an empty uuid.
void annotate_with_driver_uuids(std::vector<GpuDevice>& gpus,
                                const std::filesystem::path& proc = proc_root());

/// "00000000:3B:00.0" (NVML) or "0000:3b:00.0" (sysfs, /proc) -> "0000:3b:00.0": one spelling to
/// compare; text that is no bus id comes back lowercased.
std::string normalise_bus_id(std::string_view text);

/// One process that holds memory on a GPU, as NVML lists it.
struct GpuProcess {
  int pid = 0;
  unsigned long long used_bytes = 0;  ///< 0 when NVML cannot tell (no permission, MIG).
};

/// The compute processes holding memory on the GPU at `bus_id`, from NVML (dlopen'ed, never
/// linked; loaded only by the callers that need it, never on a launch). nullopt: NVML is absent,
/// or does not know the GPU.
std::optional<std::vector<GpuProcess>> nvml_processes_on(const std::string& bus_id);

/// The GPUs a launch may use, in topology order: NUMA node, then PCIe switch, then bus id.
/// `allowed` is a CUDA_VISIBLE_DEVICES-style list (indices, UUIDs or "GPU-" prefixes);
/// nullopt means all. Returns an error string naming the bad entry when it matches no GPU.
struct TopologyOrder {
  std::vector<GpuDevice> gpus;
  std::string error;
};
TopologyOrder topology_order(std::vector<GpuDevice> gpus,
                             const std::optional<std::string>& allowed = std::nullopt);

/// First line of a sysfs attribute, trimmed, or "" when it is missing or unreadable.
std::string read_attribute(const std::filesystem::path& path);

/// A sysfs attribute holding one decimal int, or `fallback` when missing or malformed.
int read_int(const std::filesystem::path& path, int fallback);

/// Parses a kernel cpulist ("0-3,8,10-11"); nullopt when malformed.
std::optional<std::vector<int>> parse_cpulist(const std::string& text);
/// The inverse: sorted numbers (CPUs, ranks) in that syntax; "" for none.
std::string format_cpulist(const std::vector<int>& sorted);

}  // namespace mcprun
