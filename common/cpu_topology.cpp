#include "common/cpu_topology.hpp"

#include <sched.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <iterator>
#include <memory>
#include <utility>

namespace mcprun {
namespace fs = std::filesystem;
namespace {

constexpr std::array<std::pair<NumaBinding, std::string_view>, 4> kBindingNames{{
    {NumaBinding::kNode, "node"},
    {NumaBinding::kSocket, "socket"},
    {NumaBinding::kExclusive, "exclusive"},
    {NumaBinding::kCoreComplex, "core-complex"},
}};
/// sched_getaffinity's mask grows to this many CPUs before the launcher gives up on it.
constexpr int kMaxAffinityCpus = 1 << 16;

/// N when `name` is `prefix` followed by a decimal number N, as in "cpu12" or "index3".
std::optional<int> numbered(const std::string& name, std::string_view prefix) {
  if (!name.starts_with(prefix) || name.size() == prefix.size()) return std::nullopt;
  int value = 0;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size();
  auto [end, ec] = std::from_chars(first, last, value);
  if (ec != std::errc() || end != last || value < 0) return std::nullopt;
  return value;
}

/// The entries of `dir` named <prefix>N, by N; none when the folder is missing.
std::map<int, fs::path> numbered_entries(const fs::path& dir, std::string_view prefix) {
  std::map<int, fs::path> entries;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (auto n = numbered(it->path().filename().string(), prefix)) entries.emplace(*n, it->path());
  return entries;
}

/// The lowest CPU of a cpulist attribute; -1 when missing, empty or malformed.
int lowest_cpu(const fs::path& attribute) {
  auto cpus = parse_cpulist(read_attribute(attribute));
  return cpus && !cpus->empty() ? *std::min_element(cpus->begin(), cpus->end()) : -1;
}

/// Torch's key for a CPU's complex: the lowest CPU sharing its highest-level Unified or Data
/// cache. Instruction caches never count; the first index at the top level wins.
int highest_cache_group(const fs::path& cpu_dir) {
  int top_level = -1, group = -1;
  for (const auto& [index, dir] : numbered_entries(cpu_dir / "cache", "index")) {
    const std::string type = read_attribute(dir / "type");
    if (type != "Unified" && type != "Data") continue;
    const int level = read_int(dir / "level", -1);
    if (level <= top_level) continue;
    top_level = level;
    group = lowest_cpu(dir / "shared_cpu_list");
  }
  return group;
}

/// A cpulist for messages, "none" when empty.
std::string describe_cpus(const std::vector<int>& cpus) {
  return cpus.empty() ? "none" : format_cpulist(cpus);
}

/// The NUMA node torch binds a GPU's worker to. A GPU without one (numa_node -1) is on the only
/// node when there is just one, as torch assumes; with several nodes guessing node 0 as torch
/// does could bind to the wrong socket, so that is an error.
Expected<int> gpu_numa_node(const GpuDevice& gpu, const CpuTopology& topology) {
  if (gpu.numa_node >= 0) {
    if (!topology.numa_nodes.contains(gpu.numa_node))
      return Error{"GPU " + gpu.bus_id + " is on NUMA node " + std::to_string(gpu.numa_node) +
                   ", which has no devices/system/node/node" + std::to_string(gpu.numa_node) +
                   "/cpulist in sysfs"};
    return gpu.numa_node;
  }
  if (topology.numa_nodes.size() == 1) return topology.numa_nodes.begin()->first;
  return Error{
      "GPU " + gpu.bus_id + " reports no NUMA node (numa_node -1) and this machine has " +
      std::to_string(topology.numa_nodes.size()) +
      " NUMA nodes, so there is no node to bind its worker to; run without --numa-binding"};
}

/// The CPUs of NUMA node `node` that the launcher may use, sorted.
std::vector<int> allowed_cpus_of(int node, const CpuTopology& topology) {
  std::vector<int> cpus;
  auto it = topology.numa_nodes.find(node);
  if (it == topology.numa_nodes.end()) return cpus;
  std::vector<int> all = it->second;
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  std::set_intersection(all.begin(), all.end(), topology.allowed.begin(), topology.allowed.end(),
                        std::back_inserter(cpus));
  return cpus;
}

const LogicalCpu* find_cpu(int cpu, const CpuTopology& topology) {
  auto it = topology.cpus.find(cpu);
  return it == topology.cpus.end() ? nullptr : &it->second;
}

/// The GPU's place among the GPUs on `node`, in pci_index order (torch's sorted CUDA indices),
/// and how many there are. `gpu` counts even when the caller left it out of `node_gpus`.
std::pair<size_t, size_t> relative_index(const GpuDevice& gpu, int node,
                                         const std::vector<GpuDevice>& node_gpus,
                                         const CpuTopology& topology) {
  std::vector<std::pair<int, std::string>> peers{{gpu.pci_index, gpu.bus_id}};
  for (const GpuDevice& other : node_gpus) {
    auto other_node = gpu_numa_node(other, topology);
    if (other.bus_id != gpu.bus_id && other_node && *other_node == node)
      peers.emplace_back(other.pci_index, other.bus_id);
  }
  std::sort(peers.begin(), peers.end());
  auto self = std::find(peers.begin(), peers.end(), std::pair(gpu.pci_index, gpu.bus_id));
  return {static_cast<size_t>(self - peers.begin()), peers.size()};
}

/// Groups `cpus` by `key_of` (torch's _group_by), groups in key order.
template <typename KeyOf>
std::map<int, std::vector<int>> group_by(const std::vector<int>& cpus, KeyOf key_of) {
  std::map<int, std::vector<int>> groups;
  for (int cpu : cpus) groups[key_of(cpu)].push_back(cpu);
  return groups;
}

Expected<std::vector<int>> socket_cpus(int node, const std::vector<int>& here,
                                       const CpuTopology& topology) {
  // Torch names a node's socket by the package of its lowest allowed CPU.
  auto package_of = [&](int cpu) {
    const LogicalCpu* info = find_cpu(cpu, topology);
    return info ? info->package : -1;
  };
  const int package = package_of(here.front());
  if (package < 0)
    return Error{"cannot tell the socket of NUMA node " + std::to_string(node) + ": cpu" +
                 std::to_string(here.front()) + " has no topology/physical_package_id in sysfs"};
  std::vector<int> cpus;
  for (const auto& [other, ignored] : topology.numa_nodes) {
    // Nodes with no allowed CPU (memory-only, or outside the cgroup) add nothing; torch raises.
    std::vector<int> theirs = allowed_cpus_of(other, topology);
    if (!theirs.empty() && package_of(theirs.front()) == package)
      cpus.insert(cpus.end(), theirs.begin(), theirs.end());
  }
  std::sort(cpus.begin(), cpus.end());
  return cpus;
}

Expected<std::vector<int>> exclusive_cpus(int node, const std::vector<int>& here,
                                          std::pair<size_t, size_t> place,
                                          const CpuTopology& topology) {
  // A CPU with no thread_siblings_list is a core of its own.
  auto cores = group_by(here, [&](int cpu) {
    const LogicalCpu* info = find_cpu(cpu, topology);
    return info && info->core >= 0 ? info->core : cpu;
  });
  const auto [self, gpus] = place;
  if (cores.size() < gpus)
    return Error{"NUMA node " + std::to_string(node) + " has " + std::to_string(cores.size()) +
                 " physical cores this launcher may use but " + std::to_string(gpus) +
                 " GPUs; --numa-binding=exclusive needs a core per GPU (use node or socket)"};
  // Lower relative indices take the cores left over from an even split, one each.
  const size_t per_gpu = cores.size() / gpus, extra = cores.size() % gpus;
  const size_t start = self * per_gpu + std::min(self, extra);
  const size_t end = start + per_gpu + (self < extra ? 1 : 0);
  std::vector<int> cpus;
  auto first = std::next(cores.begin(), static_cast<std::ptrdiff_t>(start));
  auto last = std::next(cores.begin(), static_cast<std::ptrdiff_t>(end));
  for (auto it = first; it != last; ++it)
    cpus.insert(cpus.end(), it->second.begin(), it->second.end());
  std::sort(cpus.begin(), cpus.end());
  return cpus;
}

Expected<std::vector<int>> core_complex_cpus(const std::vector<int>& here,
                                             std::pair<size_t, size_t> place,
                                             const CpuTopology& topology) {
  for (int cpu : here) {
    const LogicalCpu* info = find_cpu(cpu, topology);
    if (!info || info->cache_group < 0)
      return Error{"--numa-binding=core-complex needs the cache tree in sysfs, but cpu" +
                   std::to_string(cpu) + " has no Unified or Data cache under cache/index*"};
  }
  auto groups = group_by(here, [&](int cpu) { return find_cpu(cpu, topology)->cache_group; });
  // Torch's order: complexes with more allowed CPUs first, then by their lowest CPU.
  std::vector<std::pair<int, std::vector<int>>> complexes(groups.begin(), groups.end());
  std::stable_sort(complexes.begin(), complexes.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  return complexes[place.first % complexes.size()].second;
}

}  // namespace

std::optional<NumaBinding> parse_numa_binding(std::string_view text) {
  for (const auto& [binding, name] : kBindingNames)
    if (name == text) return binding;
  return std::nullopt;
}

std::string_view to_string(NumaBinding binding) {
  for (const auto& [candidate, name] : kBindingNames)
    if (candidate == binding) return name;
  return "?";
}

std::vector<int> launcher_affinity() {
  // CPU_ALLOC masks, doubled until the kernel's fits: a fixed cpu_set_t stops at 1024 CPUs.
  for (int size = 1024; size <= kMaxAffinityCpus; size *= 2) {
    std::unique_ptr<cpu_set_t, void (*)(cpu_set_t*)> mask(CPU_ALLOC(size),
                                                          [](cpu_set_t* m) { CPU_FREE(m); });
    if (!mask) return {};
    const size_t bytes = CPU_ALLOC_SIZE(size);
    CPU_ZERO_S(bytes, mask.get());
    if (sched_getaffinity(0, bytes, mask.get()) != 0) {
      if (errno == EINVAL) continue;
      return {};
    }
    std::vector<int> cpus;
    for (int cpu = 0; cpu < size; ++cpu)
      if (CPU_ISSET_S(cpu, bytes, mask.get())) cpus.push_back(cpu);
    return cpus;
  }
  return {};
}

CpuTopology read_cpu_topology(const fs::path& sysfs, std::optional<std::vector<int>> allowed) {
  CpuTopology topology;
  const fs::path system = sysfs / "devices" / "system";
  for (const auto& [id, dir] : numbered_entries(system / "cpu", "cpu")) {
    LogicalCpu& cpu = topology.cpus[id];
    cpu.package = read_int(dir / "topology" / "physical_package_id", -1);
    cpu.core = lowest_cpu(dir / "topology" / "thread_siblings_list");
    cpu.cache_group = highest_cache_group(dir);
  }
  for (const auto& [id, dir] : numbered_entries(system / "node", "node"))
    topology.numa_nodes[id] =
        parse_cpulist(read_attribute(dir / "cpulist")).value_or(std::vector<int>{});
  topology.allowed = allowed ? std::move(*allowed) : launcher_affinity();
  std::sort(topology.allowed.begin(), topology.allowed.end());
  topology.allowed.erase(std::unique(topology.allowed.begin(), topology.allowed.end()),
                         topology.allowed.end());
  return topology;
}

Expected<std::vector<int>> numa_binding_cpus(NumaBinding binding, const GpuDevice& gpu,
                                             const std::vector<GpuDevice>& node_gpus,
                                             const CpuTopology& topology) {
  auto node = gpu_numa_node(gpu, topology);
  if (!node) return node.error();
  const int numa_node = *node;
  std::vector<int> here = allowed_cpus_of(numa_node, topology);
  if (here.empty())
    return Error{"NUMA node " + std::to_string(numa_node) + " of GPU " + gpu.bus_id +
                 " has no CPU this launcher may run on (node CPUs: " +
                 describe_cpus(topology.numa_nodes.at(numa_node)) +
                 "; allowed: " + describe_cpus(topology.allowed) + ")"};
  switch (binding) {
    case NumaBinding::kNode:
      return here;
    case NumaBinding::kSocket:
      return socket_cpus(numa_node, here, topology);
    case NumaBinding::kExclusive:
      return exclusive_cpus(numa_node, here, relative_index(gpu, numa_node, node_gpus, topology),
                            topology);
    case NumaBinding::kCoreComplex:
      return core_complex_cpus(here, relative_index(gpu, numa_node, node_gpus, topology), topology);
  }
  return Error{"unknown --numa-binding mode"};
}

}  // namespace mcprun
