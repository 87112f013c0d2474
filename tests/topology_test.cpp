#include "common/topology.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <optional>

#include "tests/fake_sysfs.hpp"

namespace mcprun {
namespace {

using testing::FakeSysfs;
using Ids = std::vector<std::string>;

Ids bus_ids(const std::vector<GpuDevice>& gpus) {
  Ids ids;
  for (const auto& gpu : gpus) ids.push_back(gpu.bus_id);
  return ids;
}

/// Four GPUs whose bus order alternates between NUMA nodes 0 and 1, as on many 2-socket boxes.
void add_interleaved_numa(FakeSysfs& sysfs) {
  sysfs.add({.bus_id = "0000:1a:00.0", .numa_node = 0, .local_cpulist = "0-3"});
  sysfs.add({.bus_id = "0000:3b:00.0", .numa_node = 1, .local_cpulist = "4-7"});
  sysfs.add({.bus_id = "0000:5e:00.0", .numa_node = 0, .local_cpulist = "0-3"});
  sysfs.add({.bus_id = "0000:86:00.0", .numa_node = 1, .local_cpulist = "4-7"});
}

TEST(Cpulist, ParsesKernelSyntax) {
  EXPECT_EQ(parse_cpulist("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpulist("5"), std::vector<int>{5});
  EXPECT_EQ(parse_cpulist("2-2"), std::vector<int>{2});
  EXPECT_EQ(parse_cpulist(""), std::vector<int>{});
  EXPECT_EQ(parse_cpulist("\n"), std::vector<int>{});
}

TEST(Cpulist, RejectsMalformedText) {
  for (const char* bad : {"3-1", "a", "1,,2", "1,", ",1", "-1", "1-", "0-3-5", "0x1", "1 2",
                          "4294967296", "0-2000000"})
    EXPECT_FALSE(parse_cpulist(bad)) << bad;
}

TEST(Discovery, FindsOnlyNvidiaGpusWithTheirPlacement) {
  FakeSysfs sysfs;
  sysfs.add({.bus_id = "0000:3b:00.0",
             .numa_node = 1,
             .local_cpulist = "8-15",
             .switch_bus_id = "0000:3a:00.0"});
  sysfs.add({.bus_id = "0000:3b:00.1",
             .numa_node = 1,
             .local_cpulist = "8-15",
             .switch_bus_id = "0000:3a:00.0",
             .device_class = "0x040300"});  // Its audio function.
  sysfs.add({.bus_id = "0000:1a:00.0",
             .numa_node = 0,
             .local_cpulist = "0-7",
             .device_class = "0x030000"});  // A VGA-class NVIDIA GPU counts too.
  sysfs.add({.bus_id = "0000:00:1f.0",
             .local_cpulist = "0-7",
             .device_class = "0x030000",
             .vendor = "0x8086"});  // Someone else's VGA.
  sysfs.add({.bus_id = "0000:00:14.0", .device_class = "0x0c0330", .vendor = "0x8086"});  // USB.

  auto gpus = discover_gpus(sysfs.root());
  ASSERT_EQ(bus_ids(gpus), (Ids{"0000:1a:00.0", "0000:3b:00.0"}));
  EXPECT_EQ(gpus[0].pci_index, 0);
  EXPECT_EQ(gpus[1].pci_index, 1);
  EXPECT_EQ(gpus[1].numa_node, 1);
  EXPECT_EQ(gpus[1].local_cpus, (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(gpus[1].pci_parents, (Ids{"pci0000:00", "0000:3a:00.0"}));
  EXPECT_EQ(gpus[1].switch_id(), "0000:3a:00.0");
  EXPECT_EQ(gpus[0].switch_id(), "pci0000:00");
  EXPECT_EQ(gpus[1].link_width, 8);
  EXPECT_EQ(gpus[1].max_link_width, 16);
  EXPECT_EQ(gpus[1].link_speed, "8.0 GT/s PCIe");
  EXPECT_EQ(gpus[1].max_link_speed, "16.0 GT/s PCIe");
  EXPECT_EQ(gpus[1].uuid, "");
  EXPECT_EQ(gpus[1].cuda_visible_name(), "1");
}

TEST(Discovery, EmptyOrMissingTreeMeansNoGpusAndNoError) {
  FakeSysfs sysfs;
  auto gpus = discover_gpus(sysfs.root());
  EXPECT_TRUE(gpus.empty());
  auto order = topology_order(gpus);
  EXPECT_TRUE(order.gpus.empty());
  EXPECT_EQ(order.error, "");
  EXPECT_TRUE(discover_gpus("/nonexistent/mcprun-sysfs").empty());
}

TEST(Discovery, MissingFilesFallBackToUnknown) {
  FakeSysfs sysfs;
  sysfs.add({.bus_id = "0000:1a:00.0", .numa_node = std::nullopt, .local_cpulist = "garbage"});
  sysfs.add({.bus_id = "0000:2a:00.0", .numa_node = -1});
  std::filesystem::remove(sysfs.root() / "devices/pci0000:00/0000:2a:00.0/max_link_width");
  auto gpus = discover_gpus(sysfs.root());
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].numa_node, -1);
  EXPECT_TRUE(gpus[0].local_cpus.empty());
  EXPECT_EQ(gpus[1].numa_node, -1);
  EXPECT_EQ(gpus[1].max_link_width, 0);
}

TEST(Discovery, PlainDirectoryEntryHasNoPciParents) {
  FakeSysfs sysfs;
  sysfs.add({.bus_id = "0000:1a:00.0", .symlinked = false});
  auto gpus = discover_gpus(sysfs.root());
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_TRUE(gpus[0].pci_parents.empty());
  EXPECT_EQ(gpus[0].switch_id(), "");
}

TEST(Discovery, UppercaseEntryNamesAreLowercased) {
  FakeSysfs sysfs;
  sysfs.add({.bus_id = "0000:3B:00.0"});
  auto gpus = discover_gpus(sysfs.root());
  EXPECT_EQ(bus_ids(gpus), Ids{"0000:3b:00.0"});
}

TEST(TopologyOrder, InterleavedNumaNodesGetConsecutiveRanks) {
  FakeSysfs sysfs;
  add_interleaved_numa(sysfs);
  auto gpus = discover_gpus(sysfs.root());
  EXPECT_EQ(bus_ids(gpus), (Ids{"0000:1a:00.0", "0000:3b:00.0", "0000:5e:00.0", "0000:86:00.0"}));
  auto order = topology_order(gpus);
  EXPECT_EQ(order.error, "");
  EXPECT_EQ(bus_ids(order.gpus),
            (Ids{"0000:1a:00.0", "0000:5e:00.0", "0000:3b:00.0", "0000:86:00.0"}));
  // pci_index still names each GPU's place in bus order, which is what CUDA will be told.
  EXPECT_EQ(order.gpus[1].cuda_visible_name(), "2");
}

TEST(TopologyOrder, GpusUnderOneSwitchAreNeighbours) {
  FakeSysfs sysfs;  // Bus order alternates between two switches on one NUMA node.
  sysfs.add({.bus_id = "0000:18:00.0", .switch_bus_id = "0000:16:00.0"});
  sysfs.add({.bus_id = "0000:1c:00.0", .switch_bus_id = "0000:1b:00.0"});
  sysfs.add({.bus_id = "0000:20:00.0", .switch_bus_id = "0000:16:00.0"});
  sysfs.add({.bus_id = "0000:24:00.0", .switch_bus_id = "0000:1b:00.0"});
  auto order = topology_order(discover_gpus(sysfs.root()));
  EXPECT_EQ(bus_ids(order.gpus),
            (Ids{"0000:18:00.0", "0000:20:00.0", "0000:1c:00.0", "0000:24:00.0"}));
}

TEST(TopologyOrder, UnknownNumaSortsLast) {
  FakeSysfs sysfs;
  sysfs.add({.bus_id = "0000:1a:00.0", .numa_node = std::nullopt});
  sysfs.add({.bus_id = "0000:3b:00.0", .numa_node = 1});
  sysfs.add({.bus_id = "0000:5e:00.0", .numa_node = 0});
  auto order = topology_order(discover_gpus(sysfs.root()));
  EXPECT_EQ(bus_ids(order.gpus), (Ids{"0000:5e:00.0", "0000:3b:00.0", "0000:1a:00.0"}));
}

TEST(TopologyOrder, OrderDoesNotDependOnInputOrder) {
  FakeSysfs sysfs;
  add_interleaved_numa(sysfs);
  auto gpus = discover_gpus(sysfs.root());
  auto reversed = gpus;
  std::reverse(reversed.begin(), reversed.end());
  EXPECT_EQ(bus_ids(topology_order(gpus).gpus), bus_ids(topology_order(reversed).gpus));
}

TEST(AllowedSet, InheritedSubsetIsOrderedByTheSameRule) {
  FakeSysfs sysfs;
  add_interleaved_numa(sysfs);
  auto order = topology_order(discover_gpus(sysfs.root()), std::string("3,0"));
  EXPECT_EQ(order.error, "");
  EXPECT_EQ(bus_ids(order.gpus), (Ids{"0000:1a:00.0", "0000:86:00.0"}));
  EXPECT_EQ(order.gpus[1].cuda_visible_name(), "3");
  // Whitespace around entries is ignored.
  EXPECT_EQ(bus_ids(topology_order(discover_gpus(sysfs.root()), std::string(" 3 , 0 ")).gpus),
            (Ids{"0000:1a:00.0", "0000:86:00.0"}));
}

TEST(AllowedSet, UuidsAndGpuPrefixesNameGpus) {
  FakeSysfs sysfs;
  add_interleaved_numa(sysfs);
  auto gpus = discover_gpus(sysfs.root());
  gpus[2].uuid = "GPU-5e5e5e5e-0000-0000-0000-000000000000";
  gpus[3].uuid = "GPU-86868686-0000-0000-0000-000000000000";

  auto full = topology_order(gpus, gpus[3].uuid + ",GPU-5e5e");
  EXPECT_EQ(full.error, "");
  EXPECT_EQ(bus_ids(full.gpus), (Ids{"0000:5e:00.0", "0000:86:00.0"}));
  EXPECT_EQ(full.gpus[0].cuda_visible_name(), "GPU-5e5e5e5e-0000-0000-0000-000000000000");

  // A prefix must start with "GPU-"; a shorter or bare fragment of a UUID names nothing.
  EXPECT_NE(topology_order(gpus, std::string("GPU")).error.find("matches no GPU"),
            std::string::npos);
  EXPECT_NE(topology_order(gpus, std::string("5e5e")).error, "");
  // A prefix shared by two GPUs is ambiguous, as CUDA treats it.
  EXPECT_NE(topology_order(gpus, std::string("GPU-")).error.find("more than one"),
            std::string::npos);
}

TEST(DriverUuids, EachGpuGetsTheUuidTheDriverListsForItsBusId) {
  FakeSysfs sysfs;
  add_interleaved_numa(sysfs);
  sysfs.add_driver_information("0000:86:00.0", "GPU-86868686-1111-2222-3333-444444444444", 3);
  sysfs.add_driver_information("0000:1a:00.0", "GPU-1a1a1a1a-1111-2222-3333-444444444444", 0);
  const std::string masked = "GPU-" + std::string(8, '?') + "-" + std::string(4, '?') + "-" +
                             std::string(4, '?') + "-" + std::string(4, '?') + "-" +
                             std::string(12, '?');
  sysfs.add_driver_information("0000:3b:00.0", masked, 1);  // As a container without rights reads.
  auto gpus = discover_gpus(sysfs.root());
  annotate_with_driver_uuids(gpus, sysfs.proc_root());
  EXPECT_EQ(gpus[0].uuid, "GPU-1a1a1a1a-1111-2222-3333-444444444444");
  EXPECT_EQ(gpus[1].uuid, "");  // Masked: the PCI index stands in.
  EXPECT_EQ(gpus[2].uuid, "");  // Not listed by the driver.
  EXPECT_EQ(gpus[3].uuid, "GPU-86868686-1111-2222-3333-444444444444");
  // The rank mapping follows topology order and names each GPU by its UUID, as NVML's did.
  auto order = topology_order(gpus);
  std::vector<std::string> visible;
  for (const auto& gpu : order.gpus) visible.push_back(gpu.cuda_visible_name());
  EXPECT_EQ(visible, (Ids{"GPU-1a1a1a1a-1111-2222-3333-444444444444", "2", "1",
                          "GPU-86868686-1111-2222-3333-444444444444"}));
}

TEST(DriverUuids, BusLocationLineWinsAndSpellingsMatch) {
  FakeSysfs sysfs;
  sysfs.add({.bus_id = "0000:3b:00.0"});
  sysfs.add_driver_information("0000:3B:00.0", "GPU-3b3b3b3b-1111-2222-3333-444444444444");
  auto gpus = discover_gpus(sysfs.root());
  annotate_with_driver_uuids(gpus, sysfs.proc_root());
  EXPECT_EQ(gpus[0].uuid, "GPU-3b3b3b3b-1111-2222-3333-444444444444");
  EXPECT_EQ(normalise_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(normalise_bus_id("not a bus"), "not a bus");
}

TEST(DriverUuids, NoDriverTreeLeavesUuidsEmpty) {
  FakeSysfs sysfs;
  add_interleaved_numa(sysfs);
  auto gpus = discover_gpus(sysfs.root());
  annotate_with_driver_uuids(gpus, sysfs.root() / "no-proc");
  for (const auto& gpu : gpus) EXPECT_EQ(gpu.uuid, "");
}

TEST(AllowedSet, EmptyStringAllowsNoGpus) {
  FakeSysfs sysfs;
  add_interleaved_numa(sysfs);
  auto order = topology_order(discover_gpus(sysfs.root()), std::string(""));
  EXPECT_TRUE(order.gpus.empty());
  EXPECT_EQ(order.error, "");
}

TEST(AllowedSet, EntryMatchingNothingIsAnErrorNamingIt) {
  FakeSysfs sysfs;
  add_interleaved_numa(sysfs);
  auto bad = topology_order(discover_gpus(sysfs.root()), std::string("0,9"));
  EXPECT_TRUE(bad.gpus.empty());
  EXPECT_NE(bad.error.find("'9'"), std::string::npos) << bad.error;
  EXPECT_NE(bad.error.find("0000:86:00.0"), std::string::npos) << bad.error;  // What exists.
  EXPECT_EQ(bad.error.find('\n'), std::string::npos) << bad.error;

  auto none = topology_order({}, std::string("0"));
  EXPECT_NE(none.error.find("'0'"), std::string::npos) << none.error;
}

TEST(SysfsRoot, EnvironmentReplacesSys) {
  const char* saved = ::getenv("MCPRUN_SYSFS_ROOT");
  const std::optional<std::string> previous =
      saved ? std::optional<std::string>(saved) : std::nullopt;
  ::setenv("MCPRUN_SYSFS_ROOT", "/tmp/fake-sys", 1);
  EXPECT_EQ(sysfs_root(), "/tmp/fake-sys");
  ::setenv("MCPRUN_SYSFS_ROOT", "", 1);
  EXPECT_EQ(sysfs_root(), "/sys");
  ::unsetenv("MCPRUN_SYSFS_ROOT");
  EXPECT_EQ(sysfs_root(), "/sys");

  FakeSysfs sysfs;
  sysfs.add({.bus_id = "0000:1a:00.0"});
  ::setenv("MCPRUN_SYSFS_ROOT", sysfs.root().c_str(), 1);
  EXPECT_EQ(bus_ids(discover_gpus()), Ids{"0000:1a:00.0"});  // The default argument follows it.
  if (previous)
    ::setenv("MCPRUN_SYSFS_ROOT", previous->c_str(), 1);
  else
    ::unsetenv("MCPRUN_SYSFS_ROOT");
}

}  // namespace
}  // namespace mcprun
