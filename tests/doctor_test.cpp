#include "launcher/commands/doctor.hpp"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/unique_fd.hpp"
#include "common/version.hpp"
#include "rendezvous/rendezvous_server.hpp"
#include "tests/fake_sysfs.hpp"

namespace mcprun {
namespace {

using testing::FakeSysfs;
using Outcome = ConnectResult::Outcome;
using namespace std::chrono_literals;

/// Every probe answers what the test planted; nothing touches the live system.
class FakeProbes : public DoctorProbes {
 public:
  Expected<FilesystemSpace> space = FilesystemSpace{24ull << 30, 24ull << 30};
  std::map<std::string, std::vector<std::string>> hosts = {{"localhost", {"127.0.0.1"}}};
  std::map<std::string, std::string> routes;      ///< Destination -> source address.
  std::map<std::string, std::string> interfaces;  ///< Local address -> interface.
  std::vector<std::string> names = {"lo", "eth0"};
  int bind_errno = 0;
  std::optional<std::string> listener;
  ConnectResult connect_result{Outcome::kRefused, ""};
  Expected<ClockReading> clock = ClockReading{};
  std::vector<std::string> connected;  ///< Endpoints connect() was asked for.

  Expected<FilesystemSpace> filesystem_space(const std::filesystem::path&) override {
    return space;
  }
  Expected<std::vector<std::string>> resolve(const std::string& host) override {
    if (hosts.contains(host)) return hosts.at(host);
    if (host.find_first_not_of("0123456789.") == std::string::npos)
      return std::vector<std::string>{host};
    return Error{"Name or service not known"};
  }
  std::optional<std::string> source_address(const std::string& address) override {
    if (!routes.contains(address)) return std::nullopt;
    return routes.at(address);
  }
  std::optional<std::string> interface_of(const std::string& address) override {
    if (!interfaces.contains(address)) return std::nullopt;
    return interfaces.at(address);
  }
  std::vector<std::string> interface_names() override { return names; }
  int bind_error(int) override { return bind_errno; }
  std::optional<std::string> listener_on(int) override { return listener; }
  ConnectResult connect(const Endpoint& endpoint, std::chrono::milliseconds) override {
    connected.push_back(endpoint.text());
    return connect_result;
  }
  Expected<ClockReading> read_clock(const Endpoint&) override { return clock; }
  Expected<TorchNccl> torch_nccl(const std::string&, const Environment&) override { return torch; }
  Expected<TorchNccl> torch = TorchNccl{"1.13.0", "", "", "", {}, ""};
  std::map<std::string, std::string> slurm_nodes;  ///< Node name -> the NodeAddr Slurm knows.
  std::optional<std::string> slurm_node_address(const std::string& node) override {
    if (!slurm_nodes.contains(node)) return std::nullopt;
    return slurm_nodes.at(node);
  }
};

/// A node with eth0 at 10.0.0.2 routing to a master at 10.0.0.1.
struct DoctorTest : ::testing::Test {
  FakeSysfs sysfs;
  FakeProbes probes;
  DoctorInputs inputs;
  DoctorTest() {
    inputs.sysfs_root = sysfs.root();
    inputs.hostname = "node-a";
    probes.hosts["node-a"] = {"10.0.0.2"};
    probes.routes["10.0.0.1"] = "10.0.0.2";
    probes.interfaces["10.0.0.2"] = "eth0";
    probes.interfaces["127.0.0.1"] = "lo";
  }
};

/// The only result of a check that must give exactly one.
CheckResult only(const std::vector<CheckResult>& results) {
  EXPECT_EQ(results.size(), 1u);
  return results.empty() ? CheckResult{} : results.front();
}

/// The environment check's result that mentions `text`; fails the test when none does.
CheckResult mentioning(const std::vector<CheckResult>& results, const std::string& text) {
  for (const CheckResult& result : results)
    if (result.finding.find(text) != std::string::npos) return result;
  ADD_FAILURE() << "no finding mentions " << text;
  return {};
}

// --- 1. /dev/shm ---

TEST_F(DoctorTest, ShmOfDockersDefaultSizeFails) {
  probes.space = FilesystemSpace{64ull << 20, 64ull << 20};
  CheckResult result = check_shm(inputs, probes);
  EXPECT_EQ(result.status, CheckStatus::kFail);
  EXPECT_EQ(result.name, "shm");
  EXPECT_NE(result.finding.find("64 MiB free of 64 MiB"), std::string::npos) << result.finding;
  EXPECT_NE(result.remedy.find("--shm-size"), std::string::npos);
  EXPECT_NE(result.remedy.find("--ipc=host"), std::string::npos);
  EXPECT_NE(result.remedy.find("remount,size="), std::string::npos);
}

TEST_F(DoctorTest, ShmBelowOneGibWarnsAndAboveIsOk) {
  probes.space = FilesystemSpace{512ull << 20, 512ull << 20};
  EXPECT_EQ(check_shm(inputs, probes).status, CheckStatus::kWarn);
  probes.space = FilesystemSpace{1ull << 30, 1ull << 30};
  CheckResult result = check_shm(inputs, probes);
  EXPECT_EQ(result.status, CheckStatus::kOk);
  EXPECT_EQ(result.finding, "/dev/shm: 1 GiB free of 1 GiB");
  EXPECT_TRUE(result.remedy.empty());
}

TEST_F(DoctorTest, ShmThatIsLargeButFullPointsAtStaleSegments) {
  probes.space = FilesystemSpace{16ull << 30, 100ull << 20};
  CheckResult result = check_shm(inputs, probes);
  EXPECT_EQ(result.status, CheckStatus::kFail);
  EXPECT_NE(result.remedy.find("stale segments"), std::string::npos) << result.remedy;
}

TEST_F(DoctorTest, ShmThatIsMissingFailsAndOneWithoutSizeWarns) {
  probes.space = Error{"statvfs(/dev/shm): No such file or directory"};
  CheckResult missing = check_shm(inputs, probes);
  EXPECT_EQ(missing.status, CheckStatus::kFail);
  EXPECT_NE(missing.finding.find("No such file"), std::string::npos);
  probes.space = FilesystemSpace{0, 0};
  EXPECT_EQ(check_shm(inputs, probes).status, CheckStatus::kWarn);
}

// --- 2. The interface ---

TEST_F(DoctorTest, InterfaceWithoutATargetIsOk) {
  CheckResult result = check_interface(inputs, probes);
  EXPECT_EQ(result.status, CheckStatus::kOk);
  EXPECT_NE(result.finding.find("single-node"), std::string::npos);
}

TEST_F(DoctorTest, InterfaceOnLoopbackMasterIsOkForOneNode) {
  inputs.master_addr = "127.0.0.1";
  CheckResult result = check_interface(inputs, probes);
  EXPECT_EQ(result.status, CheckStatus::kOk);
  EXPECT_NE(result.finding.find("loopback"), std::string::npos);
}

TEST_F(DoctorTest, InterfaceThatRoutesOverEthernetIsOk) {
  inputs.master_addr = "10.0.0.1";
  CheckResult result = check_interface(inputs, probes);
  EXPECT_EQ(result.status, CheckStatus::kOk);
  EXPECT_EQ(result.finding, "the route to MASTER_ADDR 10.0.0.1 leaves through eth0 (10.0.0.2)");
}

TEST_F(DoctorTest, InterfaceOfAMasterOnThisNodeIsItsOwn) {
  inputs.master_addr = "10.0.0.2";
  probes.routes["10.0.0.2"] = "10.0.0.2";
  CheckResult result = check_interface(inputs, probes);
  EXPECT_EQ(result.status, CheckStatus::kOk);
  EXPECT_EQ(result.finding, "MASTER_ADDR 10.0.0.2 is this node's address on eth0");
}

TEST_F(DoctorTest, InterfaceOnABridgeOrLoWarns) {
  inputs.master_addr = "172.17.0.5";
  probes.routes["172.17.0.5"] = "172.17.0.1";
  for (const char* bridge : {"docker0", "virbr0", "br-5e2f0c1a"}) {
    probes.interfaces["172.17.0.1"] = bridge;
    CheckResult result = check_interface(inputs, probes);
    EXPECT_EQ(result.status, CheckStatus::kWarn) << bridge;
    EXPECT_NE(result.finding.find(bridge), std::string::npos);
    EXPECT_NE(result.remedy.find("NCCL_SOCKET_IFNAME"), std::string::npos);
    EXPECT_NE(result.remedy.find("GLOO_SOCKET_IFNAME"), std::string::npos);
  }
  probes.interfaces["172.17.0.1"] = "lo";
  EXPECT_EQ(check_interface(inputs, probes).status, CheckStatus::kWarn);
}

TEST_F(DoctorTest, InterfaceThatNcclSocketIfnameExcludesWarns) {
  inputs.master_addr = "10.0.0.1";
  inputs.env["NCCL_SOCKET_IFNAME"] = "ib";
  CheckResult result = check_interface(inputs, probes);
  EXPECT_EQ(result.status, CheckStatus::kWarn);
  EXPECT_NE(result.finding.find("NCCL_SOCKET_IFNAME=ib excludes it"), std::string::npos);
  inputs.env["NCCL_SOCKET_IFNAME"] = "^docker,lo";
  EXPECT_EQ(check_interface(inputs, probes).status, CheckStatus::kOk);
  inputs.env["NCCL_SOCKET_IFNAME"] = "=eth0";
  EXPECT_EQ(check_interface(inputs, probes).status, CheckStatus::kOk);
  inputs.env["GLOO_SOCKET_IFNAME"] = "eth1";
  EXPECT_EQ(check_interface(inputs, probes).status, CheckStatus::kWarn);
}

TEST_F(DoctorTest, InterfaceWithoutARouteOrAnAddressFails) {
  inputs.master_addr = "10.9.9.9";
  EXPECT_EQ(check_interface(inputs, probes).status, CheckStatus::kFail);
  inputs.master_addr = "no-such-host";
  CheckResult result = check_interface(inputs, probes);
  EXPECT_EQ(result.status, CheckStatus::kFail);
  EXPECT_NE(result.finding.find("cannot resolve"), std::string::npos);
}

TEST_F(DoctorTest, InterfaceFollowsTheRendezvousHostFirst) {
  inputs.master_addr = "127.0.0.1";
  inputs.rdzv_endpoint = "10.0.0.1:29400";
  CheckResult result = check_interface(inputs, probes);
  EXPECT_EQ(result.finding,
            "the route to the rendezvous host 10.0.0.1 leaves through eth0 (10.0.0.2)");
  inputs.rdzv_endpoint = "unix:/run/rendezvousd.sock";
  inputs.master_addr.clear();
  EXPECT_EQ(check_interface(inputs, probes).status, CheckStatus::kOk);
}

// --- 3. Ports ---

TEST_F(DoctorTest, MasterPortIsCheckedOnlyWhenGiven) {
  EXPECT_TRUE(check_master_port(inputs, probes).empty());
  inputs.master_addr = "10.0.0.1";
  CheckResult result = only(check_master_port(inputs, probes));
  EXPECT_EQ(result.status, CheckStatus::kOk);
  EXPECT_NE(result.finding.find("reserves a free one"), std::string::npos);
}

TEST_F(DoctorTest, MasterPortThatIsNotANumberFails) {
  inputs.master_port = "http";
  EXPECT_EQ(only(check_master_port(inputs, probes)).status, CheckStatus::kFail);
}

TEST_F(DoctorTest, LocalMasterPortThatIsFreeIsOk) {
  inputs.master_port = "29500";  // No address: mcprun's default, loopback.
  CheckResult result = only(check_master_port(inputs, probes));
  EXPECT_EQ(result.status, CheckStatus::kOk);
  EXPECT_NE(result.finding.find("free on this node"), std::string::npos);
  EXPECT_TRUE(probes.connected.empty()) << "a local port is bound, not connected to";
}

TEST_F(DoctorTest, LocalMasterPortThatSomethingListensOnFailsNamingIt) {
  inputs.master_addr = "10.0.0.2";  // This node's own address.
  inputs.master_port = "29500";
  probes.bind_errno = EADDRINUSE;
  probes.listener = "pid 412 (python3)";
  CheckResult result = only(check_master_port(inputs, probes));
  EXPECT_EQ(result.status, CheckStatus::kFail);
  EXPECT_NE(result.finding.find("pid 412 (python3) listens on it"), std::string::npos)
      << result.finding;
  probes.listener = "";
  EXPECT_NE(only(check_master_port(inputs, probes)).finding.find("owner is hidden"),
            std::string::npos);
}

TEST_F(DoctorTest, LocalMasterPortThatIsBoundButNotListenedOnWarns) {
  inputs.master_port = "29500";
  probes.bind_errno = EADDRINUSE;
  CheckResult result = only(check_master_port(inputs, probes));
  EXPECT_EQ(result.status, CheckStatus::kWarn);
  EXPECT_NE(result.finding.find("TIME_WAIT"), std::string::npos);
}

TEST_F(DoctorTest, RemoteMasterPortByConnectOutcome) {
  inputs.master_addr = "10.0.0.1";
  inputs.master_port = "29500";
  probes.connect_result = {Outcome::kRefused, ""};
  CheckResult refused = only(check_master_port(inputs, probes));
  EXPECT_EQ(refused.status, CheckStatus::kOk);
  EXPECT_NE(refused.finding.find("nothing listens on 29500 yet"), std::string::npos);
  EXPECT_EQ(probes.connected, std::vector<std::string>{"10.0.0.1:29500"});
  probes.connect_result = {Outcome::kConnected, ""};
  CheckResult connected = only(check_master_port(inputs, probes));
  EXPECT_EQ(connected.status, CheckStatus::kOk);
  EXPECT_NE(connected.finding.find("already listens"), std::string::npos);
  probes.connect_result = {Outcome::kTimedOut, ""};
  CheckResult dropped = only(check_master_port(inputs, probes));
  EXPECT_EQ(dropped.status, CheckStatus::kWarn);
  EXPECT_NE(dropped.finding.find("packets dropped (a firewall?)"), std::string::npos);
  probes.connect_result = {Outcome::kUnreachable, "No route to host"};
  EXPECT_EQ(only(check_master_port(inputs, probes)).status, CheckStatus::kFail);
}

TEST_F(DoctorTest, RendezvousEndpointByConnectOutcome) {
  EXPECT_TRUE(check_rdzv_endpoint(inputs, probes).empty());
  inputs.rdzv_endpoint = "10.0.0.1:29400";
  probes.connect_result = {Outcome::kConnected, ""};
  EXPECT_EQ(only(check_rdzv_endpoint(inputs, probes)).status, CheckStatus::kOk);
  probes.connect_result = {Outcome::kRefused, ""};
  CheckResult refused = only(check_rdzv_endpoint(inputs, probes));
  EXPECT_EQ(refused.status, CheckStatus::kFail);
  EXPECT_NE(refused.remedy.find("rendezvousd --listen 0.0.0.0:29400"), std::string::npos);
  probes.connect_result = {Outcome::kTimedOut, ""};
  CheckResult dropped = only(check_rdzv_endpoint(inputs, probes));
  EXPECT_EQ(dropped.status, CheckStatus::kFail);
  EXPECT_NE(dropped.finding.find("a firewall?"), std::string::npos);
}

TEST_F(DoctorTest, RendezvousEndpointOnThisNodeMayBeHostedByMcprun) {
  inputs.rdzv_endpoint = "node-a:29400";  // Resolves to this node's 10.0.0.2.
  probes.connect_result = {Outcome::kRefused, ""};
  CheckResult result = only(check_rdzv_endpoint(inputs, probes));
  EXPECT_EQ(result.status, CheckStatus::kOk);
  EXPECT_NE(result.finding.find("host the rendezvous itself"), std::string::npos);
  inputs.rdzv_endpoint = "unix:/nonexistent/rdzv.sock";
  EXPECT_EQ(only(check_rdzv_endpoint(inputs, probes)).status, CheckStatus::kFail);
}

// --- 4. The environment ---

TEST_F(DoctorTest, EnvironmentThatIsCleanIsOneOk) {
  inputs.env = {{"HOME", "/root"}, {"PATH", "/usr/bin"}};
  CheckResult result = only(check_environment(inputs, probes));
  EXPECT_EQ(result.status, CheckStatus::kOk);
}

TEST_F(DoctorTest, EnvironmentNamesEachLauncherVariableAndItsValue) {
  inputs.env = {{"RANK", "3"},
                {"WORLD_SIZE", "8"},
                {"MASTER_ADDR", "10.1.1.1"},
                {"TORCHELASTIC_RUN_ID", "old"},
                {"HOME", "/root"}};
  auto results = check_environment(inputs, probes);
  ASSERT_EQ(results.size(), 4u);
  for (const auto& result : results) EXPECT_EQ(result.status, CheckStatus::kWarn) << result.finding;
  EXPECT_NE(mentioning(results, "RANK=3").finding.find("mcprun replaces it"), std::string::npos);
  EXPECT_NE(mentioning(results, "MASTER_ADDR=10.1.1.1").remedy.find("--master-addr"),
            std::string::npos);
  mentioning(results, "TORCHELASTIC_RUN_ID=old");
}

TEST_F(DoctorTest, EnvironmentCudaVisibleDevicesNeedsPciOrder) {
  inputs.env = {{"CUDA_VISIBLE_DEVICES", "1,0"}};
  CheckResult result = only(check_environment(inputs, probes));
  EXPECT_EQ(result.status, CheckStatus::kWarn);
  EXPECT_NE(result.finding.find("fastest-first"), std::string::npos);
  inputs.env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
  EXPECT_EQ(only(check_environment(inputs, probes)).status, CheckStatus::kOk);
  inputs.env = {{"CUDA_VISIBLE_DEVICES", "GPU-8e3b2c11-0000"}};  // UUIDs do not depend on order.
  EXPECT_EQ(only(check_environment(inputs, probes)).status, CheckStatus::kOk);
  inputs.env = {{"CUDA_VISIBLE_DEVICES", ""}};
  EXPECT_EQ(only(check_environment(inputs, probes)).status, CheckStatus::kWarn);
}

TEST_F(DoctorTest, EnvironmentExplainsNcclVariables) {
  inputs.env = {{"NCCL_P2P_DISABLE", "1"},
                {"NCCL_SHM_DISABLE", "1"},
                {"NCCL_DEBUG", "INFO"},
                {"NCCL_NET_GDR_LEVEL", "PHB"},
                {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"}};
  auto results = check_environment(inputs, probes);
  ASSERT_EQ(results.size(), 5u);
  CheckResult p2p = mentioning(results, "NCCL_P2P_DISABLE");
  EXPECT_EQ(p2p.status, CheckStatus::kWarn);
  EXPECT_EQ(p2p.finding,
            "NCCL_P2P_DISABLE=1: GPU peer-to-peer off; all-reduce goes through host memory, "
            "several times slower");
  EXPECT_FALSE(p2p.remedy.empty());
  EXPECT_EQ(mentioning(results, "NCCL_SHM_DISABLE").status, CheckStatus::kWarn);
  CheckResult debug = mentioning(results, "NCCL_DEBUG");
  EXPECT_EQ(debug.status, CheckStatus::kOk);
  EXPECT_TRUE(debug.remedy.empty());
  EXPECT_EQ(mentioning(results, "NCCL_NET_GDR_LEVEL").status, CheckStatus::kOk);
  EXPECT_EQ(mentioning(results, "TORCH_NCCL_ASYNC_ERROR_HANDLING").status, CheckStatus::kWarn);
}

TEST_F(DoctorTest, EnvironmentIgnoresVariablesThatChangeNothing) {
  inputs.env = {{"NCCL_P2P_DISABLE", "0"}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"}};
  EXPECT_EQ(only(check_environment(inputs, probes)).status, CheckStatus::kOk);
}

TEST_F(DoctorTest, EnvironmentIbDisableMattersOnlyWithAnAdapter) {
  inputs.env = {{"NCCL_IB_DISABLE", "1"}};
  CheckResult without = only(check_environment(inputs, probes));
  EXPECT_EQ(without.status, CheckStatus::kOk);
  EXPECT_NE(without.finding.find("no InfiniBand adapter"), std::string::npos);
  std::filesystem::create_directories(sysfs.root() / "class/infiniband/mlx5_0");
  EXPECT_EQ(only(check_environment(inputs, probes)).status, CheckStatus::kWarn);
}

TEST_F(DoctorTest, EnvironmentSocketInterfacesMustExist) {
  inputs.env = {{"NCCL_SOCKET_IFNAME", "ens"}, {"GLOO_SOCKET_IFNAME", "ens5"}};
  auto results = check_environment(inputs, probes);
  ASSERT_EQ(results.size(), 2u);
  for (const auto& result : results) EXPECT_EQ(result.status, CheckStatus::kWarn) << result.finding;
  inputs.env = {{"NCCL_SOCKET_IFNAME", "eth"}, {"GLOO_SOCKET_IFNAME", "eth0"}};
  results = check_environment(inputs, probes);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(mentioning(results, "NCCL_SOCKET_IFNAME").finding,
            "NCCL_SOCKET_IFNAME=eth: NCCL's sockets use only eth0");
  EXPECT_EQ(mentioning(results, "GLOO_SOCKET_IFNAME").status, CheckStatus::kOk);
  inputs.env = {{"NCCL_SOCKET_IFNAME", "^docker,lo"}};
  EXPECT_EQ(only(check_environment(inputs, probes)).status, CheckStatus::kOk);
}

// --- 5. GPUs ---

TEST_F(DoctorTest, GpusNoneIsOk) {
  CheckResult result = only(check_gpus(inputs));
  EXPECT_EQ(result.status, CheckStatus::kOk);
  EXPECT_EQ(result.finding, "no NVIDIA GPU found; workers run on CPU");
}

TEST_F(DoctorTest, GpusAtFullLinkAreOneOk) {
  for (const char* bus : {"0000:1a:00.0", "0000:3b:00.0"})
    sysfs.add({.bus_id = bus,
               .numa_node = 0,
               .link_width = 16,
               .max_link_width = 16,
               .link_speed = "16.0 GT/s PCIe",
               .max_link_speed = "16.0 GT/s PCIe"});
  CheckResult result = only(check_gpus(inputs));
  EXPECT_EQ(result.status, CheckStatus::kOk);
  EXPECT_EQ(result.finding, "2 GPUs: 0000:1a:00.0 (NUMA 0), 0000:3b:00.0 (NUMA 0)");
}

TEST_F(DoctorTest, GpusInAnX8SlotWarn) {
  sysfs.add({.bus_id = "0000:1a:00.0",
             .numa_node = 0,
             .link_width = 16,
             .max_link_width = 16,
             .link_speed = "16.0 GT/s PCIe",
             .max_link_speed = "16.0 GT/s PCIe"});
  sysfs.add({.bus_id = "0000:41:00.0",
             .numa_node = 0,
             .link_width = 8,
             .max_link_width = 16,
             .link_speed = "16.0 GT/s PCIe",
             .max_link_speed = "16.0 GT/s PCIe"});
  auto results = check_gpus(inputs);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[1].status, CheckStatus::kWarn);
  EXPECT_EQ(results[1].finding, "GPU 0000:41:00.0 runs at x8 of x16");
  EXPECT_NE(results[1].remedy.find("slot"), std::string::npos);
}

TEST_F(DoctorTest, GpusBelowTheirLinkSpeedWarn) {
  sysfs.add({.bus_id = "0000:1a:00.0",
             .numa_node = 0,
             .link_width = 16,
             .max_link_width = 16,
             .link_speed = "2.5 GT/s PCIe",
             .max_link_speed = "32.0 GT/s PCIe"});
  auto results = check_gpus(inputs);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[1].finding, "GPU 0000:1a:00.0 runs at 2.5 GT/s of 32.0 GT/s");
  EXPECT_NE(results[1].remedy.find("under load"), std::string::npos);
}

TEST_F(DoctorTest, GpusWithUnknownLinkAreNotJudged) {
  sysfs.add({.bus_id = "0000:1a:00.0",
             .numa_node = 0,
             .link_width = 0,
             .max_link_width = 0,
             .link_speed = "Unknown",
             .max_link_speed = "Unknown"});
  EXPECT_EQ(only(check_gpus(inputs)).status, CheckStatus::kOk);
}

TEST_F(DoctorTest, GpusWithoutNumaWarnAndAcrossNumaSuggestBinding) {
  sysfs.add({.bus_id = "0000:1a:00.0",
             .numa_node = std::nullopt,
             .link_width = 16,
             .link_speed = "16.0 GT/s PCIe"});
  auto results = check_gpus(inputs);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[1].status, CheckStatus::kWarn);
  EXPECT_NE(results[1].finding.find("no NUMA affinity known for 0000:1a:00.0"), std::string::npos);

  FakeSysfs two_sockets;
  inputs.sysfs_root = two_sockets.root();
  two_sockets.add(
      {.bus_id = "0000:1a:00.0", .numa_node = 0, .link_width = 16, .link_speed = "16.0 GT/s PCIe"});
  two_sockets.add(
      {.bus_id = "0000:86:00.0", .numa_node = 1, .link_width = 16, .link_speed = "16.0 GT/s PCIe"});
  CheckResult spans = only(check_gpus(inputs));
  EXPECT_EQ(spans.status, CheckStatus::kOk);
  EXPECT_NE(spans.finding.find("span NUMA nodes 0, 1: --bind numa"), std::string::npos)
      << spans.finding;
}

// --- 6-7. memlock, hostname ---

TEST_F(DoctorTest, MemlockUnlimitedIsOkElseWarns) {
  EXPECT_EQ(check_memlock(inputs).status, CheckStatus::kOk);
  inputs.memlock_bytes = 8ull << 20;
  CheckResult result = check_memlock(inputs);
  EXPECT_EQ(result.status, CheckStatus::kWarn);
  EXPECT_NE(result.finding.find("8 MiB (ulimit -l 8192)"), std::string::npos) << result.finding;
  EXPECT_NE(result.remedy.find("ulimit -l unlimited"), std::string::npos);
  EXPECT_NE(result.remedy.find("LimitMEMLOCK=infinity"), std::string::npos);
}

TEST_F(DoctorTest, HostnameOnLoopbackWarns) {
  EXPECT_EQ(check_hostname(inputs, probes).status, CheckStatus::kOk);
  probes.hosts["node-a"] = {"127.0.1.1"};
  CheckResult result = check_hostname(inputs, probes);
  EXPECT_EQ(result.status, CheckStatus::kWarn);
  EXPECT_NE(result.finding.find("resolves to 127.0.1.1 (loopback)"), std::string::npos);
  EXPECT_NE(result.remedy.find("/etc/hosts"), std::string::npos);
  probes.hosts.erase("node-a");
  EXPECT_EQ(check_hostname(inputs, probes).status, CheckStatus::kWarn);
  inputs.hostname.clear();
  EXPECT_EQ(check_hostname(inputs, probes).status, CheckStatus::kWarn);
}

// --- 8. Clock ---

TEST_F(DoctorTest, ClockIsMeasuredOnlyWithARendezvous) {
  EXPECT_TRUE(check_clock(inputs, probes).empty());
}

TEST_F(DoctorTest, ClockSkewThresholds) {
  inputs.rdzv_endpoint = "10.0.0.1:29400";
  probes.clock = ClockReading{12ms, 2ms};
  CheckResult fine = only(check_clock(inputs, probes));
  EXPECT_EQ(fine.status, CheckStatus::kOk);
  EXPECT_NE(fine.finding.find("12.0 ms behind the rendezvous's (+- 1.00 ms"), std::string::npos)
      << fine.finding;
  probes.clock = ClockReading{-2500ms, 2ms};
  CheckResult off = only(check_clock(inputs, probes));
  EXPECT_EQ(off.status, CheckStatus::kWarn);
  EXPECT_NE(off.finding.find("2.500 s ahead of"), std::string::npos) << off.finding;
  EXPECT_NE(off.remedy.find("chrony"), std::string::npos);
  probes.clock = ClockReading{90s, 2ms};
  EXPECT_EQ(only(check_clock(inputs, probes)).status, CheckStatus::kFail);
  // 1.2 s +- 0.5 s may be 0.7 s: not surely above the 1 s threshold.
  probes.clock = ClockReading{1200ms, 1000ms};
  EXPECT_EQ(only(check_clock(inputs, probes)).status, CheckStatus::kOk);
}

TEST_F(DoctorTest, ClockThatCannotBeReadWarnsUnlessTheRendezvousIsHere) {
  inputs.rdzv_endpoint = "10.0.0.1:29400";
  probes.clock = Error{"nothing listens at 10.0.0.1:29400"};
  EXPECT_EQ(only(check_clock(inputs, probes)).status, CheckStatus::kWarn);
  inputs.rdzv_endpoint = "127.0.0.1:29400";
  EXPECT_EQ(only(check_clock(inputs, probes)).status, CheckStatus::kOk);
}

// --- The report ---

TEST_F(DoctorTest, ReportPrintsOneLinePerCheckAndRemediesIndented) {
  std::vector<CheckResult> results = {
      {"shm", CheckStatus::kOk, "/dev/shm: 24 GiB free of 24 GiB", ""},
      {"gpus", CheckStatus::kWarn, "GPU 0000:41:00.0 runs at x8 of x16", "move it"},
      {"rdzv-endpoint", CheckStatus::kFail, "nothing listens", "start rendezvousd"}};
  EXPECT_EQ(format_doctor_text(results, false),
            "OK    shm: /dev/shm: 24 GiB free of 24 GiB\n"
            "WARN  gpus: GPU 0000:41:00.0 runs at x8 of x16\n"
            "      move it\n"
            "FAIL  rdzv-endpoint: nothing listens\n"
            "      start rendezvousd\n"
            "mcprun doctor: 1 OK, 1 WARN, 1 FAIL\n");
  EXPECT_NE(format_doctor_text(results, true).find("\x1b[31mFAIL\x1b[0m"), std::string::npos);
  EXPECT_EQ(doctor_exit_code(results), 1);
  results.pop_back();
  EXPECT_EQ(doctor_exit_code(results), 0);

  auto json = nlohmann::json::parse(format_doctor_json(results));
  ASSERT_EQ(json["checks"].size(), 2u);
  EXPECT_EQ(json["checks"][1]["check"], "gpus");
  EXPECT_EQ(json["checks"][1]["status"], "WARN");
  EXPECT_EQ(json["checks"][1]["remedy"], "move it");
  EXPECT_EQ(json["summary"]["warn"], 1);
  EXPECT_EQ(json["summary"]["exit_code"], 0);
  EXPECT_EQ(json["summary"]["mcprun_version"], mcprun_version());
}

TEST_F(DoctorTest, RunChecksCoversEveryCheckInOrder) {
  inputs.master_addr = "10.0.0.1";
  inputs.master_port = "29500";
  inputs.rdzv_endpoint = "10.0.0.1:29400";
  probes.connect_result = {Outcome::kConnected, ""};
  std::vector<std::string> names;
  for (const CheckResult& result : run_checks(inputs, probes))
    if (names.empty() || names.back() != result.name) names.push_back(result.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"shm", "interface", "master-port", "rdzv-endpoint",
                                      "environment", "gpus", "memlock", "hostname", "clock"}));
  inputs.python = "python3";
  EXPECT_EQ(run_checks(inputs, probes).back().name, "nccl");
}

/// A CUDA build of torch as a pip install has it: NCCL from the nvidia-nccl-cu12 wheel.
TorchNccl cuda_torch(std::string loaded, std::vector<std::string> libraries) {
  return {"2.4.0+cu121", "12.1", std::move(loaded), "", std::move(libraries), "2.20.5"};
}

/// The nccl check's one finding about the torch `probes` plant.
CheckResult nccl_finding(DoctorInputs inputs, FakeProbes& probes) {
  inputs.python = "python3";
  auto results = check_nccl(inputs, probes);
  EXPECT_EQ(results.size(), 1u);
  return results.at(0);
}

TEST_F(DoctorTest, NcclIsCheckedOnlyWithAPython) {
  EXPECT_TRUE(check_nccl(inputs, probes).empty());
  const CheckResult result = nccl_finding(inputs, probes);
  EXPECT_EQ(result.status, CheckStatus::kOk);
  EXPECT_EQ(result.finding, "torch 1.13.0 is a CPU build: no NCCL (gloo only)");
}

TEST_F(DoctorTest, NcclThatTorchShipsWithIsOk) {
  probes.torch = cuda_torch("2.20.5", {"/venv/nvidia/nccl/lib/libnccl.so.2"});
  const CheckResult result = nccl_finding(inputs, probes);
  EXPECT_EQ(result.status, CheckStatus::kOk);
  EXPECT_EQ(
      result.finding,
      "torch 2.4.0+cu121 (CUDA 12.1) runs NCCL 2.20.5 from /venv/nvidia/nccl/lib/libnccl.so.2, "
      "the version it ships with");
}

TEST_F(DoctorTest, NcclOtherThanTheShippedOneWarnsNamingTheLibrary) {
  probes.torch = cuda_torch("2.18.1", {"/usr/lib/x86_64-linux-gnu/libnccl.so.2.18.1"});
  const CheckResult result = nccl_finding(inputs, probes);
  EXPECT_EQ(result.status, CheckStatus::kWarn);
  EXPECT_EQ(result.finding,
            "torch 2.4.0+cu121 ships with NCCL 2.20.5 but runs NCCL 2.18.1 from "
            "/usr/lib/x86_64-linux-gnu/libnccl.so.2.18.1");
  EXPECT_NE(result.remedy.find("LD_LIBRARY_PATH"), std::string::npos);
}

TEST_F(DoctorTest, TwoNcclLibrariesInOneProcessWarn) {
  probes.torch =
      cuda_torch("2.20.5", {"/opt/nccl/libnccl.so.2", "/venv/nvidia/nccl/lib/libnccl.so.2"});
  const CheckResult result = nccl_finding(inputs, probes);
  EXPECT_EQ(result.status, CheckStatus::kWarn);
  EXPECT_NE(result.finding.find("has 2 NCCL libraries mapped"), std::string::npos);
}

TEST_F(DoctorTest, NcclThatCannotLoadOrATorchThatCannotBeAskedWarns) {
  probes.torch =
      TorchNccl{"2.4.0+cu121", "12.1", "", "libnccl.so.2: cannot open shared object file", {}, ""};
  EXPECT_EQ(nccl_finding(inputs, probes).status, CheckStatus::kWarn);
  probes.torch = Error{"cannot import torch: No module named 'torch'"};
  const CheckResult result = nccl_finding(inputs, probes);
  EXPECT_EQ(result.status, CheckStatus::kWarn);
  EXPECT_EQ(result.finding,
            "cannot ask python3 for torch's NCCL: cannot import torch: No module named 'torch'");
  EXPECT_NE(result.remedy.find("PYTHON_EXEC"), std::string::npos);
}

// --- 10. Slurm ---

/// Node 1 of a two-node step of job 1234, as srun --ntasks-per-node=1 sets it.
Environment slurm_step(int node_id) {
  return {{"SLURM_JOB_ID", "1234"},          {"SLURM_STEP_ID", "0"},
          {"SLURM_STEP_NUM_NODES", "2"},     {"SLURM_NODEID", std::to_string(node_id)},
          {"SLURM_STEP_NODELIST", "n[1-2]"}, {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
          {"SLURM_STEP_GPUS", "0,1"}};
}

std::vector<std::string> names_of(const std::vector<CheckResult>& results) {
  std::vector<std::string> names;
  for (const CheckResult& result : results) names.push_back(result.name);
  return names;
}

TEST_F(DoctorTest, SlurmIsSilentOutsideSlurm) {
  EXPECT_TRUE(check_slurm(inputs, probes).empty());
  inputs.env = slurm_step(1);
  inputs.env["MCPRUN_SLURM"] = "0";  // mcprun ignores Slurm then, and so does its doctor.
  EXPECT_TRUE(check_slurm(inputs, probes).empty());
}

TEST_F(DoctorTest, SlurmStepSaysWhatMcprunTakesAndReachesTheFirstNode) {
  inputs.env = slurm_step(1);
  probes.hosts["n1"] = {"10.0.0.1"};
  probes.connect_result = {Outcome::kRefused, ""};
  const auto results = check_slurm(inputs, probes);
  ASSERT_EQ(names_of(results), (std::vector<std::string>{"slurm", "slurm-master"}));
  EXPECT_EQ(results[0].status, CheckStatus::kOk);
  EXPECT_EQ(results[0].finding.substr(0, results[0].finding.find(" (with")),
            "Slurm job 1234 step 0, node 1 of 2: mcprun takes nnodes 2, node rank 1, master n1 "
            "(10.0.0.1) port 21234, run id 1234.0, GPUs 0,1");
  EXPECT_EQ(results[1].status, CheckStatus::kOk);
  EXPECT_NE(results[1].finding.find("first node n1: 10.0.0.1 is reachable"), std::string::npos)
      << results[1].finding;
  EXPECT_EQ(probes.connected, std::vector<std::string>{"10.0.0.1:21234"});
  probes.connect_result = {Outcome::kTimedOut, ""};
  EXPECT_EQ(check_slurm(inputs, probes)[1].status, CheckStatus::kWarn);
  probes.connect_result = {Outcome::kUnreachable, "No route to host"};
  EXPECT_EQ(check_slurm(inputs, probes)[1].status, CheckStatus::kFail);
}

TEST_F(DoctorTest, SlurmNodeZeroIsTheMasterAndBindsItsPort) {
  inputs.env = slurm_step(0);
  probes.hosts["n1"] = {"10.0.0.2"};  // This node's own address.
  auto results = check_slurm(inputs, probes);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[1].status, CheckStatus::kOk);
  EXPECT_NE(results[1].finding.find("21234 is free on this node"), std::string::npos);
  EXPECT_TRUE(probes.connected.empty());
  probes.bind_errno = EADDRINUSE;
  probes.listener = "pid 77 (python3)";
  EXPECT_EQ(check_slurm(inputs, probes)[1].status, CheckStatus::kFail);
}

TEST_F(DoctorTest, SlurmFirstNodeFallsBackToItsNodeAddrElseFails) {
  inputs.env = slurm_step(1);
  probes.slurm_nodes["n1"] = "10.0.0.1";  // getaddrinfo does not know n1; scontrol does.
  auto results = check_slurm(inputs, probes);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_NE(results[0].finding.find("master n1 (10.0.0.1) port 21234"), std::string::npos);
  EXPECT_EQ(results[1].status, CheckStatus::kOk);
  probes.slurm_nodes.clear();
  results = check_slurm(inputs, probes);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_NE(results[0].finding.find("master n1 (no address)"), std::string::npos);
  EXPECT_EQ(results[1].status, CheckStatus::kFail);
  EXPECT_NE(results[1].remedy.find("--master-addr"), std::string::npos);
}

TEST_F(DoctorTest, SlurmMoreThanOneTaskPerNodeWarns) {
  inputs.env = slurm_step(0);
  inputs.env["SLURM_STEP_TASKS_PER_NODE"] = "2";
  inputs.env["SLURM_STEP_NUM_NODES"] = "1";
  inputs.env["SLURM_STEP_NODELIST"] = "n1";
  probes.hosts["n1"] = {"10.0.0.2"};
  auto results = check_slurm(inputs, probes);
  ASSERT_EQ(names_of(results), (std::vector<std::string>{"slurm", "slurm", "slurm-master"}));
  EXPECT_EQ(results[1].status, CheckStatus::kWarn);
  EXPECT_NE(results[1].finding.find("2 tasks on one node"), std::string::npos);
  EXPECT_NE(results[1].remedy.find("srun --ntasks-per-node=1 mcprun"), std::string::npos);
}

TEST_F(DoctorTest, SlurmJobOutsideAStepWarnsAndAMalformedVariableFails) {
  inputs.env = {{"SLURM_JOB_ID", "1234"}};  // The batch script's own shell.
  CheckResult outside = only(check_slurm(inputs, probes));
  EXPECT_EQ(outside.status, CheckStatus::kWarn);
  EXPECT_NE(outside.finding.find("outside a step"), std::string::npos);
  inputs.env = slurm_step(0);
  inputs.env["SLURM_NODEID"] = "first";
  CheckResult malformed = only(check_slurm(inputs, probes));
  EXPECT_EQ(malformed.status, CheckStatus::kFail);
  EXPECT_NE(malformed.finding.find("SLURM_NODEID=first"), std::string::npos);
}

TEST_F(DoctorTest, SlurmChecksComeAfterTheEndpoints) {
  inputs.env = slurm_step(1);
  probes.hosts["n1"] = {"10.0.0.1"};
  std::vector<std::string> names;
  for (const CheckResult& result : run_checks(inputs, probes))
    if (names.empty() || names.back() != result.name) names.push_back(result.name);
  EXPECT_EQ(names, (std::vector<std::string>{"shm", "interface", "slurm", "slurm-master",
                                             "environment", "gpus", "memlock", "hostname"}));
}

TEST_F(DoctorTest, AMalformedRendezvousEndpointFailsNamingIt) {
  inputs.rdzv_endpoint = "[fd00::1]";
  const CheckResult result = only(check_rdzv_endpoint(inputs, probes));
  EXPECT_EQ(result.status, CheckStatus::kFail);
  EXPECT_EQ(result.finding,
            "--rdzv-endpoint '[fd00::1]': expected HOST:PORT, [IPV6]:PORT or unix:PATH");
  EXPECT_TRUE(check_clock(inputs, probes).empty());  // The endpoint check said why.
  inputs.rdzv_endpoint = "[fd00::1]:29400";
  probes.hosts["fd00::1"] = {"fd00::1"};
  probes.connect_result = {Outcome::kConnected, ""};
  EXPECT_EQ(only(check_rdzv_endpoint(inputs, probes)).status, CheckStatus::kOk);
  EXPECT_EQ(probes.connected, std::vector<std::string>{"[fd00::1]:29400"});
}

TEST(DoctorCommand, BadFlagsAreUsageErrors) {
  EXPECT_EQ(run_doctor({"--master-port", "0"}), 2);
  EXPECT_EQ(run_doctor({"--master-port", "many"}), 2);
  EXPECT_EQ(run_doctor({"--rdzv-endpoint", "head"}), 2);
  EXPECT_EQ(run_doctor({"--frobnicate"}), 2);
}

// --- The real probes, against real sockets on loopback ---

/// A TCP socket listening on 127.0.0.1 and a free port.
struct Listener {
  UniqueFd fd{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  int port = 0;
  explicit Listener(bool listen = true) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), length), 0);
    if (listen) {
      EXPECT_EQ(::listen(fd.get(), 4), 0);
    }
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length);
    port = ntohs(address.sin_port);
  }
};

TEST(SystemDoctorProbes, FindsWhoListensOnAPort) {
  SystemDoctorProbes probes;
  Listener listener;
  EXPECT_EQ(probes.bind_error(listener.port), EADDRINUSE);
  auto owner = probes.listener_on(listener.port);
  ASSERT_TRUE(owner.has_value());
  EXPECT_TRUE(owner->empty() || owner->starts_with("pid " + std::to_string(::getpid()) + " "))
      << *owner;
  EXPECT_EQ(probes.connect({"127.0.0.1", listener.port, ""}, kDoctorConnectTimeout).outcome,
            Outcome::kConnected);
}

TEST(SystemDoctorProbes, TellsABoundPortFromAListenedOne) {
  SystemDoctorProbes probes;
  Listener bound(/*listen=*/false);
  EXPECT_EQ(probes.bind_error(bound.port), EADDRINUSE);
  EXPECT_EQ(probes.listener_on(bound.port), std::nullopt);
  EXPECT_EQ(probes.connect({"127.0.0.1", bound.port, ""}, kDoctorConnectTimeout).outcome,
            Outcome::kRefused);
}

TEST(SystemDoctorProbes, TimesOutWhereSynsAreDropped) {
  SystemDoctorProbes probes;
  Listener full(/*listen=*/false);
  ASSERT_EQ(::listen(full.fd.get(), 0), 0);  // Once its accept queue is full, SYNs are dropped.
  std::optional<Outcome> last;
  for (int attempt = 0; attempt < 8 && last != Outcome::kTimedOut; ++attempt)
    last = probes.connect({"127.0.0.1", full.port, ""}, 200ms).outcome;
  EXPECT_EQ(last, Outcome::kTimedOut);
}

TEST(SystemDoctorProbes, RoutesLoopbackOverLo) {
  SystemDoctorProbes probes;
  EXPECT_EQ(probes.source_address("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(probes.interface_of("127.0.0.1"), "lo");
  auto localhost = probes.resolve("localhost");
  ASSERT_TRUE(localhost);
  EXPECT_FALSE(localhost->empty());
  EXPECT_FALSE(probes.resolve("no-such-host.invalid"));
}

TEST(SystemDoctorProbes, MeasuresAFilesystem) {
  SystemDoctorProbes probes;
  auto space = probes.filesystem_space(std::filesystem::temp_directory_path());
  ASSERT_TRUE(space);
  EXPECT_GT(space->total_bytes, 0u);
  EXPECT_FALSE(probes.filesystem_space("/nonexistent/shm"));
}

TEST(SystemDoctorProbes, ReadsTheRendezvousClockBeforeAnyJoin) {
  boost::asio::io_context io;
  ServerSettings settings;
  settings.token = "secret";  // The clock needs no token.
  RendezvousServer server(io, {boost::asio::ip::make_address("127.0.0.1"), 0}, settings);
  const int port = server.local_endpoint().port();
  std::thread loop([&] { io.run(); });
  SystemDoctorProbes probes;
  auto reading = probes.read_clock({"127.0.0.1", port, ""});
  boost::asio::post(io, [&] { server.stop(); });
  loop.join();
  ASSERT_TRUE(reading) << reading.error().message;
  const ClockReading& clock = *reading;
  EXPECT_LT(std::chrono::abs(clock.skew), 1s) << "one host, one clock";
  EXPECT_GE(clock.rtt.count(), 0);
}

TEST(SystemDoctorProbes, AsksDebiansTorchForItsNccl) {
  SystemDoctorProbes probes;
  auto torch = probes.torch_nccl("/usr/bin/python3", current_environment());
  ASSERT_TRUE(torch) << torch.error().message;
  EXPECT_EQ(torch->torch_version.rfind("1.13", 0), 0u);
  EXPECT_EQ(torch->cuda_version, "") << "Debian's torch is a CPU build";
}

TEST(SystemDoctorProbes, ReadsWhatTheInterpreterAnswersAndNamesOneThatDoesNot) {
  const testing::TempDir dir("doctor-python");
  auto interpreter = [&](const std::string& name, const std::string& body) {
    const auto path = dir / name;
    std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
    return path.string();
  };
  SystemDoctorProbes probes;
  auto answered = probes.torch_nccl(
      interpreter("cuda-python",
                  R"(echo '{"torch": "2.4.0", "cuda": "12.1", "loaded": "2.18.1", )"
                  R"("libraries": ["/usr/lib/libnccl.so.2"], "shipped": "2.20.5"}')"),
      current_environment());
  ASSERT_TRUE(answered) << answered.error().message;
  EXPECT_EQ(answered->loaded, "2.18.1");
  EXPECT_EQ(answered->shipped, "2.20.5");
  EXPECT_EQ(answered->libraries, std::vector<std::string>{"/usr/lib/libnccl.so.2"});

  auto silent = probes.torch_nccl(interpreter("silent-python", "exit 1"), current_environment());
  ASSERT_FALSE(silent);
  EXPECT_NE(silent.error().message.find("printed no answer (nothing)"), std::string::npos);
  auto missing = probes.torch_nccl((dir / "no-such-python").string(), current_environment());
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("No such file"), std::string::npos)
      << missing.error().message;
}

TEST(SystemDoctorProbes, ReportsARefusedClock) {
  SystemDoctorProbes probes;
  Listener bound(/*listen=*/false);  // Holds a port nothing listens on.
  auto reading = probes.read_clock({"127.0.0.1", bound.port, ""});
  ASSERT_FALSE(reading);
  EXPECT_NE(reading.error().message.find("nothing listens"), std::string::npos);
}

}  // namespace
}  // namespace mcprun
