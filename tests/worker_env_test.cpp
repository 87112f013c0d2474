#include "launcher/plan/worker_env.hpp"

#include <gtest/gtest.h>

#include <algorithm>

namespace mcprun {
namespace {

JobIdentity four_rank_job() {
  return JobIdentity{"127.0.0.1", 29511, "job7", "trainer", 2, 4, 4, 0, 1, false,
                     "SIGTERM,SIGINT,SIGHUP,SIGQUIT"};
}

WorkerIdentity worker(int local_rank, std::vector<std::string> visible_gpus = {}) {
  WorkerIdentity identity;
  identity.local_rank = identity.rank = local_rank;
  identity.visible_gpus = std::move(visible_gpus);
  return identity;
}

TEST(WorkerEnv, TorchrunContract) {
  Environment env = worker_env_delta(four_rank_job(), worker(2), 1,
                                     "/run/attempt_1/2/error.json", {});
  EXPECT_EQ(env["RANK"], "2");
  EXPECT_EQ(env["LOCAL_RANK"], "2");
  EXPECT_EQ(env["GROUP_RANK"], "0");
  EXPECT_EQ(env["ROLE_RANK"], "2");
  EXPECT_EQ(env["ROLE_NAME"], "trainer");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(env["WORLD_SIZE"], "4");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "1");
  EXPECT_EQ(env["ROLE_WORLD_SIZE"], "4");
  EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "29511");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "1");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "2");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "job7");
  EXPECT_EQ(env["TORCHELASTIC_SIGNALS_TO_HANDLE"], "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
  EXPECT_EQ(env["TORCHELASTIC_ERROR_FILE"], "/run/attempt_1/2/error.json");
  EXPECT_EQ(env["NCCL_ASYNC_ERROR_HANDLING"], "1");
  EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
  EXPECT_FALSE(env.contains("CUDA_VISIBLE_DEVICES"));
}

TEST(WorkerEnv, UserSettingsKept) {
  Environment inherited{{"OMP_NUM_THREADS", "6"}, {"NCCL_ASYNC_ERROR_HANDLING", "0"}};
  Environment env = worker_env_delta(four_rank_job(), worker(0), 0, "e", inherited);
  EXPECT_FALSE(env.contains("OMP_NUM_THREADS"));
  EXPECT_EQ(env["NCCL_ASYNC_ERROR_HANDLING"], "0");
  JobIdentity single = four_rank_job();
  single.local_world_size = single.world_size = 1;
  EXPECT_FALSE(worker_env_delta(single, worker(0), 0, "e", {}).contains("OMP_NUM_THREADS"));
}

TEST(WorkerEnv, PinnedWorkerSeesTheNodesGpusSoLocalRankIndexesThem) {
  Environment env = worker_env_delta(four_rank_job(), worker(2, {"GPU-a", "GPU-b", "GPU-c", "GPU-d"}),
                                     0, "e", {});
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "GPU-a,GPU-b,GPU-c,GPU-d");
  EXPECT_EQ(env["LOCAL_RANK"], "2");
  EXPECT_EQ(env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
}

TEST(WorkerEnv, VirtualLocalRankIsZeroWithOneVisibleGpu) {
  JobIdentity job = four_rank_job();
  job.virtual_local_rank = true;
  Environment env = worker_env_delta(job, worker(3, {"5"}), 0, "e", {});
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "5");
  EXPECT_EQ(env["LOCAL_RANK"], "0");
  EXPECT_EQ(env["RANK"], "3");
}

TEST(WorkerEnv, InheritedLauncherVariablesAreReplacedWithAWarning) {
  Environment inherited{{"RANK", "5"},         {"MASTER_ADDR", "10.1.1.1"},
                        {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RUN_ID", "old"},
                        {"OMP_NUM_THREADS", "2"}, {"HOME", "/root"}};
  auto warnings = environment_warnings(four_rank_job(), inherited);
  ASSERT_EQ(warnings.size(), 4u);
  auto mentions = [&](const std::string& a, const std::string& b) {
    return std::any_of(warnings.begin(), warnings.end(), [&](const std::string& w) {
      return w.find(a) != std::string::npos && w.find(b) != std::string::npos;
    });
  };
  EXPECT_TRUE(mentions("MASTER_ADDR='10.1.1.1'", "'127.0.0.1'"));
  EXPECT_TRUE(mentions("MASTER_PORT='29500'", "'29511'"));
  EXPECT_TRUE(mentions("RANK='5'", "per-worker"));
  EXPECT_TRUE(mentions("TORCHELASTIC_RUN_ID='old'", "'job7'"));

  auto merged = merge_environment(inherited, worker_env_delta(four_rank_job(), worker(1),
                                                              0, "e", inherited));
  auto has = [&](const std::string& entry) {
    return std::find(merged.begin(), merged.end(), entry) != merged.end();
  };
  EXPECT_TRUE(has("RANK=1"));
  EXPECT_TRUE(has("MASTER_ADDR=127.0.0.1"));
  EXPECT_TRUE(has("HOME=/root"));
  EXPECT_FALSE(has("RANK=5"));
  EXPECT_FALSE(has("TORCHELASTIC_RUN_ID=old"));
}

}  // namespace
}  // namespace mcprun
