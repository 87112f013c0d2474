#include "common/topology.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "tests/fake_sysfs.hpp"

namespace mcprun {
namespace {

using testing::FakeSysfs;

std::vector<std::string> bus_ids(const std::vector<GpuDevice>& gpus) {
  std::vector<std::string> ids;
  for (const auto& gpu : gpus) ids.push_back(gpu.bus_id);
  return ids;
}

TEST(Cpulist, ParsesKernelSyntaxAndRejectsGarbage) {
  EXPECT_EQ(parse_cpulist("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpulist("\n"), std::vector<int>{});
  EXPECT_FALSE(parse_cpulist("3-1"));
  EXPECT_FALSE(parse_cpulist("a"));
  EXPECT_FALSE(parse_cpulist("1,,2"));
  EXPECT_FALSE(parse_cpulist("1,"));
}

TEST(Discovery, FindsOnlyNvidiaGpusWithTheirPlacement) {
  FakeSysfs sysfs;
  sysfs.add("0000:3b:00.0", 1, "8-15", "0000:3a:00.0");
  sysfs.add("0000:3b:00.1", 1, "8-15", "0000:3a:00.0", "0x040300");  // The GPU's audio function.
  sysfs.add("0000:1a:00.0", 0, "0-7");
  sysfs.add("0000:00:1f.0", 0, "0-7", "", "0x030000", "0x8086");     // Someone else's VGA.
  auto gpus = discover_gpus(sysfs.root());
  ASSERT_EQ(bus_ids(gpus), (std::vector<std::string>{"0000:1a:00.0", "0000:3b:00.0"}));
  EXPECT_EQ(gpus[1].pci_index, 1);
  EXPECT_EQ(gpus[1].numa_node, 1);
  EXPECT_EQ(gpus[1].local_cpus.size(), 8u);
  EXPECT_EQ(gpus[1].switch_id(), "0000:3a:00.0");
  EXPECT_EQ(gpus[0].switch_id(), "pci0000:00");
  EXPECT_EQ(gpus[1].link_width, 8);
  EXPECT_EQ(gpus[1].max_link_width, 16);
}

TEST(Discovery, MissingTreeOrFilesIsNotAnError) {
  EXPECT_TRUE(discover_gpus("/nonexistent/sysfs").empty());
  FakeSysfs sysfs;
  sysfs.add("0000:1a:00.0", 0, "", "", "0x030200", "0x10de", /*write_numa=*/false);
  auto gpus = discover_gpus(sysfs.root());
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].numa_node, -1);
}

TEST(TopologyOrder, InterleavedNumaNodesGetConsecutiveRanks) {
  FakeSysfs sysfs;
  sysfs.add("0000:1a:00.0", 0, "0");
  sysfs.add("0000:3b:00.0", 1, "1");
  sysfs.add("0000:5e:00.0", 0, "0");
  sysfs.add("0000:86:00.0", 1, "1");
  auto order = topology_order(discover_gpus(sysfs.root()));
  EXPECT_EQ(bus_ids(order.gpus), (std::vector<std::string>{"0000:1a:00.0", "0000:5e:00.0",
                                                           "0000:3b:00.0", "0000:86:00.0"}));
}

TEST(TopologyOrder, GpusUnderOneSwitchAreNeighbours) {
  FakeSysfs sysfs;  // Bus order alternates between two switches on one NUMA node.
  sysfs.add("0000:18:00.0", 0, "0", "0000:16:00.0");
  sysfs.add("0000:1c:00.0", 0, "0", "0000:1b:00.0");
  sysfs.add("0000:20:00.0", 0, "0", "0000:16:00.0");
  sysfs.add("0000:24:00.0", 0, "0", "0000:1b:00.0");
  auto order = topology_order(discover_gpus(sysfs.root()));
  EXPECT_EQ(bus_ids(order.gpus), (std::vector<std::string>{"0000:18:00.0", "0000:20:00.0",
                                                           "0000:1c:00.0", "0000:24:00.0"}));
}

TEST(TopologyOrder, InheritedVisibleDevicesIsOrderedByTheSameRule) {
  FakeSysfs sysfs;
  sysfs.add("0000:1a:00.0", 0, "0");
  sysfs.add("0000:3b:00.0", 1, "1");
  sysfs.add("0000:5e:00.0", 0, "0");
  sysfs.add("0000:86:00.0", 1, "1");
  auto gpus = discover_gpus(sysfs.root());
  gpus[2].uuid = "GPU-5e5e5e5e-0000";
  auto order = topology_order(gpus, std::string("3, 0"));
  EXPECT_EQ(bus_ids(order.gpus), (std::vector<std::string>{"0000:1a:00.0", "0000:86:00.0"}));
  EXPECT_EQ(bus_ids(topology_order(gpus, std::string("GPU-5e5e")).gpus),
            std::vector<std::string>{"0000:5e:00.0"});
  EXPECT_EQ(topology_order(gpus, std::string("GPU-5e5e")).gpus[0].cuda_visible_name(),
            "GPU-5e5e5e5e-0000");
  EXPECT_TRUE(topology_order(gpus, std::string("")).gpus.empty());
  auto bad = topology_order(gpus, std::string("0,9"));
  EXPECT_NE(bad.error.find("'9'"), std::string::npos);
}

TEST(SysfsRoot, EnvironmentReplacesSys) {
  ::setenv("MCPRUN_SYSFS_ROOT", "/tmp/fake-sys", 1);
  EXPECT_EQ(sysfs_root(), "/tmp/fake-sys");
  ::unsetenv("MCPRUN_SYSFS_ROOT");
  EXPECT_EQ(sysfs_root(), "/sys");
}

}  // namespace
}  // namespace mcprun
