#include "launcher/plan/rank_plan.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/temp_dir.hpp"

namespace mcprun {
namespace {

GpuDevice gpu(const std::string& bus_id, int numa, std::vector<int> cpus) {
  GpuDevice device;
  device.bus_id = bus_id;
  device.numa_node = numa;
  device.local_cpus = std::move(cpus);
  return device;
}

/// Four GPUs whose bus order interleaves two NUMA nodes.
std::vector<GpuDevice> interleaved_box() {
  std::vector<GpuDevice> gpus{gpu("0000:1a:00.0", 0, {0}), gpu("0000:3b:00.0", 1, {1}),
                              gpu("0000:5e:00.0", 0, {0}), gpu("0000:86:00.0", 1, {1})};
  for (size_t i = 0; i < gpus.size(); ++i) gpus[i].pci_index = static_cast<int>(i);
  return gpus;
}

class RankPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    script_ = std::filesystem::temp_directory_path() /
              ("rank_plan_test_" + std::to_string(::getpid()) + ".py");
    std::ofstream(script_) << "print('hi')\n";
  }
  void TearDown() override { std::filesystem::remove(script_); }

  LaunchConfig config(int nproc) {
    LaunchConfig config;
    config.nproc.count = nproc;
    config.script = script_.string();
    return config;
  }
  Environment env_{{"PATH", "/usr/bin:/bin"}, {"PYTHON_EXEC", "/bin/sh"}};
  std::filesystem::path script_;
};

TEST_F(RankPlanTest, LocalRanksFollowTopologyAndPinOneGpuEach) {
  LaunchConfig cfg = config(4);
  cfg.bind = LaunchConfig::CpuBind::kNuma;
  auto planned = build_rank_plan(cfg, interleaved_box(), env_, 29500);
  ASSERT_TRUE(planned);
  const RankPlan& plan = *planned;
  ASSERT_TRUE(plan.pinned);
  std::vector<std::string> order;
  for (const RankSlot& slot : plan.slots) order.push_back(slot.identity.gpu->bus_id);
  EXPECT_EQ(order, (std::vector<std::string>{"0000:1a:00.0", "0000:5e:00.0", "0000:3b:00.0",
                                             "0000:86:00.0"}));
  EXPECT_EQ(plan.slots[2].cpus, std::vector<int>{1});
  // cuda:LOCAL_RANK is the rank's GPU: every worker sees the job's GPUs in rank order.
  for (const RankSlot& slot : plan.slots) {
    EXPECT_EQ(slot.identity.visible_gpus, (std::vector<std::string>{"0", "2", "1", "3"}));
    EXPECT_EQ(slot.identity.visible_gpus[slot.identity.local_rank],
              std::to_string(slot.identity.gpu->pci_index));
  }
  EXPECT_EQ(plan.argv, (std::vector<std::string>{"/bin/sh", "-u", script_.string()}));
}

TEST_F(RankPlanTest, MoreRanksThanGpusNeedsNoPin) {
  auto planned = build_rank_plan(config(5), interleaved_box(), env_, 1);
  ASSERT_FALSE(planned);
  EXPECT_NE(planned.error().message.find("--no-pin"), std::string::npos);
  LaunchConfig cfg = config(5);
  cfg.no_pin = true;
  auto unpinned = build_rank_plan(cfg, interleaved_box(), env_, 1);
  ASSERT_TRUE(unpinned);
  EXPECT_FALSE(unpinned->slots[0].identity.gpu);
}

TEST_F(RankPlanTest, InheritedVisibleDevicesIsTheAllowedSet) {
  env_["CUDA_VISIBLE_DEVICES"] = "3,0";
  LaunchConfig cfg = config(1);
  cfg.nproc.kind = NprocSpec::Kind::kGpu;
  auto planned = build_rank_plan(cfg, interleaved_box(), env_, 1);
  ASSERT_TRUE(planned);
  const RankPlan& plan = *planned;
  ASSERT_EQ(plan.slots.size(), 2u);
  EXPECT_EQ(plan.slots[0].identity.gpu->bus_id, "0000:1a:00.0");
  EXPECT_EQ(plan.slots[1].identity.gpu->bus_id, "0000:86:00.0");
  EXPECT_EQ(plan.slots[1].identity.visible_gpus, (std::vector<std::string>{"0", "3"}));
}

TEST_F(RankPlanTest, FewerRanksThanGpusSeeOnlyTheirOwn) {
  auto planned = build_rank_plan(config(2), interleaved_box(), env_, 1);
  const RankPlan& plan = *planned;
  EXPECT_EQ(plan.slots[1].identity.visible_gpus, (std::vector<std::string>{"0", "2"}));
}

TEST_F(RankPlanTest, VirtualLocalRankGivesEachWorkerItsGpuAlone) {
  LaunchConfig cfg = config(4);
  cfg.virtual_local_rank = true;
  const RankPlan plan = *build_rank_plan(cfg, interleaved_box(), env_, 1);
  EXPECT_TRUE(plan.job.virtual_local_rank);
  EXPECT_EQ(plan.slots[1].identity.visible_gpus, std::vector<std::string>{"2"});
  EXPECT_EQ(plan.slots[2].identity.visible_gpus, std::vector<std::string>{"1"});
}

TEST_F(RankPlanTest, NoGpuIsACpuRunButGpuModeIsAnError) {
  auto planned = build_rank_plan(config(2), {}, env_, 1);
  ASSERT_TRUE(planned);
  EXPECT_FALSE(planned->pinned);
  LaunchConfig cfg = config(1);
  cfg.nproc.kind = NprocSpec::Kind::kGpu;
  EXPECT_FALSE(build_rank_plan(cfg, {}, env_, 1));
}

TEST_F(RankPlanTest, MissingScriptAndInterpreter) {
  LaunchConfig cfg = config(1);
  cfg.script = "/nonexistent/train.py";
  auto planned = build_rank_plan(cfg, {}, env_, 1);
  ASSERT_FALSE(planned);
  EXPECT_NE(planned.error().message.find("/nonexistent/train.py"), std::string::npos);
  env_["PYTHON_EXEC"] = "no-such-python";
  EXPECT_FALSE(build_rank_plan(config(1), {}, env_, 1));
}

TEST_F(RankPlanTest, DryRunShowsGpuCpusEnvAndArgv) {
  LaunchConfig cfg = config(2);
  cfg.script_args = {"--lr", "3e-4"};
  auto planned = build_rank_plan(cfg, interleaved_box(), env_, 29777);
  const std::string text = format_rank_plan(*planned, env_);
  EXPECT_NE(text.find("local rank 1 (rank 1)"), std::string::npos);
  EXPECT_NE(text.find("0000:5e:00.0"), std::string::npos);
  EXPECT_NE(text.find("CUDA_VISIBLE_DEVICES=0,2\n"), std::string::npos);
  EXPECT_NE(text.find("MASTER_PORT=29777"), std::string::npos);
  EXPECT_NE(text.find("--lr 3e-4"), std::string::npos);
}

TEST_F(RankPlanTest, DryRunPrintsWhatTheSpawnBuilderGivesEachWorker) {
  LaunchConfig cfg = config(2);
  cfg.nccl_debug = true;
  auto planned = build_rank_plan(cfg, interleaved_box(), env_, 29777);
  ASSERT_TRUE(planned);
  RankPlan& plan = *planned;
  plan.extra_env["TORCHELASTIC_TIMER_FILE"] = std::string(kDryRunDir) + "/timer.fifo";
  const std::string text = format_rank_plan(plan, env_);
  for (const RankSlot& slot : plan.slots) {
    const auto rank_dir =
        std::filesystem::path(kDryRunDir) / "attempt_0" / std::to_string(slot.identity.local_rank);
    const Environment spawned = worker_spawn_delta(plan, slot, 0, rank_dir, env_);
    // Every variable the worker gets, under that worker's heading.
    const size_t start = text.find("local rank " + std::to_string(slot.identity.local_rank) + " ");
    ASSERT_NE(start, std::string::npos);
    const std::string section = text.substr(start, text.find("local rank ", start + 1) - start);
    for (const auto& [name, value] : spawned)
      EXPECT_NE(section.find("    " + name + "=" + value + "\n"), std::string::npos) << name;
    EXPECT_EQ(spawned.at("TORCHELASTIC_TIMER_FILE"), "<run dir>/timer.fifo");
    EXPECT_EQ(spawned.at("NCCL_DEBUG_FILE"), (rank_dir / "nccl.%h.%p.log").string());
    EXPECT_EQ(spawned.at("TORCHELASTIC_ERROR_FILE"), (rank_dir / "error.json").string());
  }
  // A user's own NCCL_DEBUG_FILE and a job-wide variable the worker variables own both hold.
  Environment inherited = env_;
  inherited["NCCL_DEBUG_FILE"] = "/logs/nccl.%p";
  plan.extra_env["RANK"] = "99";
  const Environment delta =
      worker_spawn_delta(plan, plan.slots[1], 3, "/run/attempt_3/1", inherited);
  EXPECT_FALSE(delta.contains("NCCL_DEBUG_FILE"));
  EXPECT_EQ(delta.at("RANK"), "1");
  EXPECT_EQ(delta.at("TORCHELASTIC_RESTART_COUNT"), "3");
}

/// A prefix with bin/mcprun and bin/python3, and `marker` (pyvenv.cfg, conda-meta/) when given.
std::filesystem::path install_prefix(const std::filesystem::path& prefix,
                                     const std::string& marker) {
  std::filesystem::create_directories(prefix / "bin");
  std::ofstream(prefix / "bin" / "mcprun");
  std::ofstream(prefix / "bin" / "python3");
  if (marker == "conda-meta")
    std::filesystem::create_directories(prefix / marker);
  else if (!marker.empty())
    std::ofstream(prefix / marker) << "home = /usr/bin\n";
  return prefix / "bin" / "mcprun";
}

TEST(WorkerPythonTest, AVenvsMcprunRunsThatVenvsPython) {
  testing::TempDir dir("worker-python");
  const auto launcher = install_prefix(dir / "venv", "pyvenv.cfg");
  EXPECT_EQ(worker_python({{"PATH", "/usr/bin"}}, launcher), (dir / "venv/bin/python3").string());
}

TEST(WorkerPythonTest, ACondaEnvsMcprunRunsThatEnvsPython) {
  testing::TempDir dir("worker-python");
  const auto launcher = install_prefix(dir / "env", "conda-meta");
  EXPECT_EQ(worker_python({}, launcher), (dir / "env/bin/python3").string());
}

TEST(WorkerPythonTest, PythonExecWinsOverTheVenv) {
  testing::TempDir dir("worker-python");
  const auto launcher = install_prefix(dir / "venv", "pyvenv.cfg");
  EXPECT_EQ(worker_python({{"PYTHON_EXEC", "/opt/py/bin/python"}}, launcher), "/opt/py/bin/python");
}

TEST(WorkerPythonTest, OutsideAPythonEnvironmentPython3IsLookedUpOnPath) {
  testing::TempDir dir("worker-python");
  // /usr/bin/mcprun beside /usr/bin/python3: the Debian package keeps PATH's python3, so an
  // activated venv still wins there.
  EXPECT_EQ(worker_python({}, install_prefix(dir / "usr", "")), "python3");
  EXPECT_EQ(worker_python({}, dir / "build/launcher/mcprun"), "python3");
  EXPECT_EQ(worker_python({}, std::filesystem::path()), "python3");
}

}  // namespace
}  // namespace mcprun
