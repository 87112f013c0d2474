#include "common/cpu_topology.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "tests/fake_sysfs.hpp"

namespace mcprun {
namespace {

using testing::FakeSysfs;
using Cpus = std::vector<int>;
using Result = Expected<Cpus>;

Cpus range(int first, int last) {
  Cpus cpus;
  for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
  return cpus;
}

Cpus join(std::initializer_list<Cpus> parts) {
  Cpus cpus;
  for (const Cpus& part : parts) cpus.insert(cpus.end(), part.begin(), part.end());
  std::sort(cpus.begin(), cpus.end());
  return cpus;
}

Cpus without(Cpus cpus, const Cpus& gone) {
  std::erase_if(cpus,
                [&](int cpu) { return std::find(gone.begin(), gone.end(), cpu) != gone.end(); });
  return cpus;
}

Cpus cpus_of(const Result& result) {
  EXPECT_TRUE(result) << result.error().message;
  return result ? *result : Cpus{};
}

std::string error_of(const Result& result) {
  EXPECT_FALSE(result);
  if (result) return "";
  const std::string& error = result.error().message;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  return error;
}

/// 2 sockets x 2 NUMA nodes x 4 cores x 2 threads; core c is CPUs c and c+16; each node's cores
/// share two L3s in pairs. Node 0: CPUs 0-3,16-19 (L3s 0-1,16-17 and 2-3,18-19); node 1: 4-7,20-23;
/// node 2: 8-11,24-27; node 3: 12-15,28-31. Nodes 0-1 are socket 0, nodes 2-3 socket 1.
/// GPUs in bus order: 0 and 2 on node 0, 1, 3 and 4 on node 1, 5 on node 2, none on node 3.
class TwoSocketMachine : public ::testing::Test {
 protected:
  void SetUp() override {
    sysfs_.add_cpus({});
    const std::pair<const char*, int> placed[] = {{"0000:18:00.0", 0}, {"0000:2a:00.0", 1},
                                                  {"0000:3b:00.0", 0}, {"0000:5d:00.0", 1},
                                                  {"0000:86:00.0", 1}, {"0000:9a:00.0", 2}};
    for (auto [bus, node] : placed) sysfs_.add({.bus_id = bus, .numa_node = node});
    gpus_ = discover_gpus(sysfs_.root());
    ASSERT_EQ(gpus_.size(), 6u);
  }

  CpuTopology topology(Cpus allowed = range(0, 31)) const {
    return read_cpu_topology(sysfs_.root(), std::move(allowed));
  }

  Result bind(NumaBinding binding, int gpu, const CpuTopology& topology) const {
    return numa_binding_cpus(binding, gpus_[gpu], gpus_, topology);
  }
  Result bind(NumaBinding binding, int gpu) const { return bind(binding, gpu, topology()); }

  FakeSysfs sysfs_;
  std::vector<GpuDevice> gpus_;
};

TEST(NumaBindingName, MatchesTorchNames) {
  for (auto binding : {NumaBinding::kNode, NumaBinding::kSocket, NumaBinding::kExclusive,
                       NumaBinding::kCoreComplex})
    EXPECT_EQ(parse_numa_binding(to_string(binding)), binding);
  EXPECT_EQ(to_string(NumaBinding::kCoreComplex), "core-complex");
  EXPECT_EQ(parse_numa_binding("socket"), NumaBinding::kSocket);
  for (const char* bad : {"", "Node", "core_complex", "corecomplex", "node ", "none"})
    EXPECT_FALSE(parse_numa_binding(bad)) << bad;
}

TEST_F(TwoSocketMachine, ReadsTheCpuTree) {
  CpuTopology read = topology({3, 1, 1});
  EXPECT_EQ(read.allowed, (Cpus{1, 3}));  // Sorted and deduplicated.
  ASSERT_EQ(read.cpus.size(), 32u);
  ASSERT_EQ(read.numa_nodes.size(), 4u);
  EXPECT_EQ(read.numa_nodes.at(1), join({range(4, 7), range(20, 23)}));
  EXPECT_EQ(read.cpus.at(21).package, 0);
  EXPECT_EQ(read.cpus.at(24).package, 1);
  EXPECT_EQ(read.cpus.at(21).core, 5);         // Siblings 5,21.
  EXPECT_EQ(read.cpus.at(21).cache_group, 4);  // L3 4-5,20-21.
  EXPECT_EQ(read.cpus.at(3).cache_group, 2);
}

TEST_F(TwoSocketMachine, HighestUnifiedOrDataCacheWinsAndInstructionCachesDoNot) {
  sysfs_.write_attribute("devices/system/cpu/cpu0/cache/index4/type", "Instruction");
  sysfs_.write_attribute("devices/system/cpu/cpu0/cache/index4/level", "4");
  sysfs_.write_attribute("devices/system/cpu/cpu0/cache/index4/shared_cpu_list", "0-31");
  sysfs_.write_attribute("devices/system/cpu/cpu1/cache/index4/type", "Unified");
  sysfs_.write_attribute("devices/system/cpu/cpu1/cache/index4/level", "4");
  sysfs_.write_attribute("devices/system/cpu/cpu1/cache/index4/shared_cpu_list", "1-7");
  CpuTopology read = topology();
  EXPECT_EQ(read.cpus.at(0).cache_group, 0);
  EXPECT_EQ(read.cpus.at(1).cache_group, 1);
}

TEST_F(TwoSocketMachine, NodeIsTheGpusNumaNode) {
  EXPECT_EQ(cpus_of(bind(NumaBinding::kNode, 0)), join({range(0, 3), range(16, 19)}));
  EXPECT_EQ(cpus_of(bind(NumaBinding::kNode, 4)), join({range(4, 7), range(20, 23)}));
  EXPECT_EQ(cpus_of(bind(NumaBinding::kNode, 5)), join({range(8, 11), range(24, 27)}));
}

TEST_F(TwoSocketMachine, SocketIsEveryNodeOfTheGpusPackage) {
  const Cpus socket0 = join({range(0, 7), range(16, 23)});
  EXPECT_EQ(cpus_of(bind(NumaBinding::kSocket, 0)), socket0);
  EXPECT_EQ(cpus_of(bind(NumaBinding::kSocket, 1)), socket0);
  EXPECT_EQ(cpus_of(bind(NumaBinding::kSocket, 5)), join({range(8, 15), range(24, 31)}));
}

TEST_F(TwoSocketMachine, ExclusiveSplitsTheNodesCoresAndLowerIndicesGetTheExtraCore) {
  // Node 0: 4 cores, 2 GPUs: 2 cores each, whole cores (both threads).
  EXPECT_EQ(cpus_of(bind(NumaBinding::kExclusive, 0)), (Cpus{0, 1, 16, 17}));
  EXPECT_EQ(cpus_of(bind(NumaBinding::kExclusive, 2)), (Cpus{2, 3, 18, 19}));
  // Node 1: 4 cores, 3 GPUs: the first (GPU 1) gets the extra core.
  EXPECT_EQ(cpus_of(bind(NumaBinding::kExclusive, 1)), (Cpus{4, 5, 20, 21}));
  EXPECT_EQ(cpus_of(bind(NumaBinding::kExclusive, 3)), (Cpus{6, 22}));
  EXPECT_EQ(cpus_of(bind(NumaBinding::kExclusive, 4)), (Cpus{7, 23}));
  // The only GPU of node 2 takes it all.
  EXPECT_EQ(cpus_of(bind(NumaBinding::kExclusive, 5)), join({range(8, 11), range(24, 27)}));
}

TEST_F(TwoSocketMachine, ExclusiveSetsAreDisjointAndCoverEachNode) {
  std::map<int, std::set<int>> covered;
  for (size_t i = 0; i < gpus_.size(); ++i) {
    for (int cpu : cpus_of(bind(NumaBinding::kExclusive, static_cast<int>(i)))) {
      EXPECT_TRUE(covered[gpus_[i].numa_node].insert(cpu).second) << "cpu" << cpu << " twice";
    }
  }
  const CpuTopology read = topology();
  for (int node : {0, 1, 2}) {
    const Cpus& all = read.numa_nodes.at(node);
    EXPECT_EQ(Cpus(covered[node].begin(), covered[node].end()), all) << "node " << node;
  }
}

TEST_F(TwoSocketMachine, ExclusiveWithFewerCoresThanGpusIsAnError) {
  for (const char* bus : {"0000:bb:00.0", "0000:bc:00.0", "0000:bd:00.0"})
    sysfs_.add({.bus_id = bus, .numa_node = 0});
  gpus_ = discover_gpus(sysfs_.root());  // Node 0 now has 5 GPUs for 4 cores.
  std::string error = error_of(bind(NumaBinding::kExclusive, 0));
  EXPECT_NE(error.find("NUMA node 0 has 4 physical cores"), std::string::npos) << error;
  EXPECT_NE(error.find("5 GPUs"), std::string::npos) << error;
  EXPECT_TRUE(bind(NumaBinding::kNode, 0));  // Others still work.
}

TEST_F(TwoSocketMachine, CoreComplexIsOneL3PerGpuWrappingAround) {
  EXPECT_EQ(cpus_of(bind(NumaBinding::kCoreComplex, 0)), (Cpus{0, 1, 16, 17}));
  EXPECT_EQ(cpus_of(bind(NumaBinding::kCoreComplex, 2)), (Cpus{2, 3, 18, 19}));
  // Node 1 has 2 complexes for 3 GPUs: the third shares the first's.
  EXPECT_EQ(cpus_of(bind(NumaBinding::kCoreComplex, 1)), (Cpus{4, 5, 20, 21}));
  EXPECT_EQ(cpus_of(bind(NumaBinding::kCoreComplex, 3)), (Cpus{6, 7, 22, 23}));
  EXPECT_EQ(cpus_of(bind(NumaBinding::kCoreComplex, 4)), (Cpus{4, 5, 20, 21}));
  // A node's only GPU still gets one complex, not the node.
  EXPECT_EQ(cpus_of(bind(NumaBinding::kCoreComplex, 5)), (Cpus{8, 9, 24, 25}));
}

TEST_F(TwoSocketMachine, RelativeIndexIsPciOrderAmongTheNodesGpus) {
  // Input order does not matter, nor GPUs of other nodes, nor leaving the GPU itself out.
  std::vector<GpuDevice> shuffled(gpus_.rbegin(), gpus_.rend());
  EXPECT_EQ(cpus_of(numa_binding_cpus(NumaBinding::kExclusive, gpus_[3], shuffled, topology())),
            (Cpus{6, 22}));
  std::vector<GpuDevice> others{gpus_[1], gpus_[4]};
  EXPECT_EQ(cpus_of(numa_binding_cpus(NumaBinding::kExclusive, gpus_[3], others, topology())),
            (Cpus{6, 22}));
  // With only node 1's first two GPUs given, GPU 3 is the second of two.
  EXPECT_EQ(cpus_of(numa_binding_cpus(NumaBinding::kExclusive, gpus_[3], {gpus_[1]}, topology())),
            (Cpus{6, 7, 22, 23}));
}

TEST_F(TwoSocketMachine, AllowedMaskTrimsEverySet) {
  // As under a Slurm/cgroup CPU set: CPU 0 and both threads of core 7 (7, 23) are not ours.
  const CpuTopology trimmed = topology(without(range(0, 31), {0, 7, 23}));
  EXPECT_EQ(cpus_of(bind(NumaBinding::kNode, 0, trimmed)), (Cpus{1, 2, 3, 16, 17, 18, 19}));
  EXPECT_EQ(cpus_of(bind(NumaBinding::kSocket, 0, trimmed)),
            without(join({range(0, 7), range(16, 23)}), {0, 7, 23}));
  // Node 0 keeps 4 cores (core 0 as CPU 16 alone); node 1 has 3 cores left for 3 GPUs.
  EXPECT_EQ(cpus_of(bind(NumaBinding::kExclusive, 0, trimmed)), (Cpus{1, 16, 17}));
  EXPECT_EQ(cpus_of(bind(NumaBinding::kExclusive, 1, trimmed)), (Cpus{4, 20}));
  EXPECT_EQ(cpus_of(bind(NumaBinding::kExclusive, 3, trimmed)), (Cpus{5, 21}));
  EXPECT_EQ(cpus_of(bind(NumaBinding::kExclusive, 4, trimmed)), (Cpus{6, 22}));
  // The L3 of 0-1,16-17 has 3 allowed CPUs left, so the full one (2-3,18-19) comes first.
  EXPECT_EQ(cpus_of(bind(NumaBinding::kCoreComplex, 0, trimmed)), (Cpus{2, 3, 18, 19}));
  EXPECT_EQ(cpus_of(bind(NumaBinding::kCoreComplex, 2, trimmed)), (Cpus{1, 16, 17}));
  EXPECT_EQ(cpus_of(bind(NumaBinding::kCoreComplex, 3, trimmed)), (Cpus{6, 22}));
}

TEST_F(TwoSocketMachine, SocketSkipsNodesWithNoAllowedCpu) {
  // Node 1 is outside our CPU set and node 4 is memory-only: socket 0 is node 0 alone (torch
  // raises on either).
  sysfs_.add_numa_node(4, "");
  const CpuTopology trimmed = topology(without(range(0, 31), join({range(4, 7), range(20, 23)})));
  EXPECT_EQ(cpus_of(bind(NumaBinding::kSocket, 0, trimmed)), join({range(0, 3), range(16, 19)}));
}

TEST_F(TwoSocketMachine, NodeWithNoAllowedCpuIsAnError) {
  const CpuTopology trimmed = topology(range(0, 7));
  for (auto binding : {NumaBinding::kNode, NumaBinding::kSocket, NumaBinding::kExclusive,
                       NumaBinding::kCoreComplex}) {
    std::string error = error_of(bind(binding, 5, trimmed));
    EXPECT_NE(error.find("NUMA node 2 of GPU 0000:9a:00.0 has no CPU"), std::string::npos) << error;
    EXPECT_NE(error.find("node CPUs: 8-11,24-27; allowed: 0-7"), std::string::npos) << error;
  }
}

TEST_F(TwoSocketMachine, GpuWithoutANumaNodeIsAnErrorWhenThereAreSeveral) {
  GpuDevice lost = gpus_[0];
  lost.numa_node = -1;
  std::string error = error_of(numa_binding_cpus(NumaBinding::kNode, lost, gpus_, topology()));
  EXPECT_NE(error.find("0000:18:00.0 reports no NUMA node"), std::string::npos) << error;

  GpuDevice beyond = gpus_[0];
  beyond.numa_node = 7;
  error = error_of(numa_binding_cpus(NumaBinding::kNode, beyond, gpus_, topology()));
  EXPECT_NE(error.find("NUMA node 7"), std::string::npos) << error;
}

TEST(NumaBindingCpus, GpuWithoutANumaNodeOnASingleNodeMachineUsesThatNode) {
  FakeSysfs sysfs;  // As torch assumes: -1 on a one-node machine means node 0.
  sysfs.add_cpus({.sockets = 1, .nodes_per_socket = 1, .cores_per_node = 4});
  sysfs.add({.bus_id = "0000:18:00.0", .numa_node = -1});
  sysfs.add({.bus_id = "0000:3b:00.0", .numa_node = -1});
  auto gpus = discover_gpus(sysfs.root());
  const CpuTopology topology = read_cpu_topology(sysfs.root(), range(0, 7));
  EXPECT_EQ(cpus_of(numa_binding_cpus(NumaBinding::kNode, gpus[1], gpus, topology)), range(0, 7));
  EXPECT_EQ(cpus_of(numa_binding_cpus(NumaBinding::kExclusive, gpus[1], gpus, topology)),
            (Cpus{2, 3, 6, 7}));
}

TEST_F(TwoSocketMachine, MissingSysfsPiecesAreErrorsNotCrashes) {
  for (int cpu : {0, 1, 16, 17})
    std::filesystem::remove_all(sysfs_.root() / ("devices/system/cpu/cpu" + std::to_string(cpu)) /
                                "cache");
  std::string error = error_of(bind(NumaBinding::kCoreComplex, 0));
  EXPECT_NE(error.find("cpu0 has no Unified or Data cache"), std::string::npos) << error;

  std::filesystem::remove(sysfs_.root() / "devices/system/cpu/cpu0/topology/physical_package_id");
  error = error_of(bind(NumaBinding::kSocket, 0));
  EXPECT_NE(error.find("cpu0 has no topology/physical_package_id"), std::string::npos) << error;

  // Without thread siblings each CPU counts as a core: node 0 has 8 for its 2 GPUs.
  for (int cpu : range(0, 31))
    std::filesystem::remove(sysfs_.root() / ("devices/system/cpu/cpu" + std::to_string(cpu)) /
                            "topology/thread_siblings_list");
  EXPECT_EQ(cpus_of(bind(NumaBinding::kExclusive, 0)), (Cpus{0, 1, 2, 3}));
}

TEST(NumaBindingCpus, MissingTreeReadsAsEmptyAndBindingSaysWhy) {
  const CpuTopology empty = read_cpu_topology("/nonexistent/mcprun-sysfs", Cpus{0, 1});
  EXPECT_TRUE(empty.cpus.empty());
  EXPECT_TRUE(empty.numa_nodes.empty());
  GpuDevice gpu;
  gpu.bus_id = "0000:18:00.0";
  gpu.numa_node = 0;
  EXPECT_NE(error_of(numa_binding_cpus(NumaBinding::kNode, gpu, {gpu}, empty)).find("NUMA node 0"),
            std::string::npos);
}

TEST(NumaBindingCpus, RealSysNodeIsANonEmptySubsetOfTheAllowedCpus) {
  if (!std::filesystem::exists("/sys/devices/system/node")) GTEST_SKIP() << "no NUMA in sysfs";
  const CpuTopology real = read_cpu_topology("/sys");
  ASSERT_FALSE(real.allowed.empty()) << "sched_getaffinity gave nothing";
  // The node holding our first allowed CPU is one a worker could be bound to.
  std::optional<int> node;
  for (const auto& [id, cpus] : real.numa_nodes)
    if (std::find(cpus.begin(), cpus.end(), real.allowed.front()) != cpus.end()) node = id;
  if (!node) GTEST_SKIP() << "no NUMA node lists CPU " << real.allowed.front();
  GpuDevice gpu;
  gpu.bus_id = "0000:00:00.0";
  gpu.numa_node = *node;
  const Cpus cpus = cpus_of(numa_binding_cpus(NumaBinding::kNode, gpu, {gpu}, real));
  ASSERT_FALSE(cpus.empty());
  EXPECT_TRUE(std::is_sorted(cpus.begin(), cpus.end()));
  EXPECT_TRUE(std::includes(real.allowed.begin(), real.allowed.end(), cpus.begin(), cpus.end()));
}

}  // namespace
}  // namespace mcprun
