// The CPU side of the machine (sockets, NUMA nodes, hyperthreads, L3 complexes) read from sysfs,
// and the CPU set torchrun 2.x's --numa-binding gives the worker of each GPU.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/expected.hpp"
#include "common/topology.hpp"

namespace mcprun {

/// torchrun's --numa-binding modes (torch.numa.binding.AffinityMode), same names and meaning.
enum class NumaBinding { kNode, kSocket, kExclusive, kCoreComplex };

/// "node", "socket", "exclusive" or "core-complex"; nullopt for anything else.
std::optional<NumaBinding> parse_numa_binding(std::string_view text);
std::string_view to_string(NumaBinding binding);

/// One logical CPU's place: what torch reads per CPU to group them.
struct LogicalCpu {
  int package = -1;      ///< physical_package_id (the socket); -1 when unknown.
  int core = -1;         ///< Lowest CPU in thread_siblings_list: names the physical core.
  int cache_group = -1;  ///< Lowest CPU sharing the highest-level Unified/Data cache (the L3).
};

/// The CPU tree of the machine, read once, plus the CPUs this launcher may run on.
struct CpuTopology {
  std::map<int, LogicalCpu> cpus;              ///< By logical CPU id; CPUs with a cpuN dir.
  std::map<int, std::vector<int>> numa_nodes;  ///< Node id -> its cpulist (allowed or not).
  std::vector<int> allowed;                    ///< Sorted sched_getaffinity of the launcher.
};

/// The CPUs this process may run on (sched_getaffinity), sorted; empty if the call fails.
std::vector<int> launcher_affinity();

/// Reads <sysfs>/devices/system/{cpu,node}. `allowed` replaces the launcher's affinity mask
/// (for tests); nullopt asks the kernel. Never throws: a missing or partial tree reads as what
/// is there, with -1 for what is unknown.
CpuTopology read_cpu_topology(const std::filesystem::path& sysfs = sysfs_root(),
                              std::optional<std::vector<int>> allowed = std::nullopt);

/// The sorted CPUs torch's --numa-binding=<binding> gives the worker that drives `gpu`, or a
/// one-line error saying why there is none. `node_gpus` are the GPUs of this host (those of
/// other NUMA nodes are ignored); the GPU's relative index is its place among those on its NUMA
/// node in pci_index order. Only allowed CPUs are ever returned.
Expected<std::vector<int>> numa_binding_cpus(NumaBinding binding, const GpuDevice& gpu,
                                             const std::vector<GpuDevice>& node_gpus,
                                             const CpuTopology& topology);

}  // namespace mcprun
