#include "launcher/plan/descriptor_budget.hpp"

#include <gtest/gtest.h>

namespace mcprun {
namespace {

LaunchConfig parsed(std::vector<std::string> args) {
  args.insert(args.end(), {"--no-python", "/bin/true"});
  auto result = parse_launch_config(args);
  EXPECT_TRUE(result && std::holds_alternative<LaunchConfig>(*result));
  return result && std::holds_alternative<LaunchConfig>(*result) ? std::get<LaunchConfig>(*result)
                                                                 : LaunchConfig{};
}

/// A plan of `local_ranks` on node `group_rank` of a job of `world_size` ranks.
RankPlan plan_of(int local_ranks, int world_size = 0, int group_rank = 0) {
  RankPlan plan;
  plan.slots.resize(static_cast<size_t>(local_ranks));
  plan.job.world_size = world_size > 0 ? world_size : local_ranks;
  plan.job.group_rank = group_rank;
  return plan;
}

// What `ls /proc/<mcprun>/fd | wc -l` showed: 20 at -n 1 and 146 at -n 64 while /bin/sh workers
// ran, 271 at -n 64 with --log-dir, 8016 at -n 2000 while the group started (every rank's pipes
// are made first), and 55 at -n 8 with torch 1.13 workers using the store, FileTimer and helper.
TEST(DescriptorBudget, CoversWhatMcprunWasSeenToHold) {
  EXPECT_GE(descriptors_needed(parsed({"-n", "1"}), plan_of(1), false), 20);
  EXPECT_GE(descriptors_needed(parsed({"-n", "64"}), plan_of(64), false), 146);
  EXPECT_GE(descriptors_needed(parsed({"-n", "64"}), plan_of(64), true), 271);
  EXPECT_GE(descriptors_needed(parsed({"-n", "2000"}), plan_of(2000), false), 8016);
  EXPECT_GE(descriptors_needed(parsed({"-n", "8"}), plan_of(8), false), 55);
}

TEST(DescriptorBudget, OnlyTheNodeServingTheStoreCountsTheJobsRanks) {
  LaunchConfig config = parsed({"--nnodes", "4", "-n", "8", "--master-addr", "10.0.0.1"});
  const long master = descriptors_needed(config, plan_of(8, 32, 0), false);
  const long other = descriptors_needed(config, plan_of(8, 32, 1), false);
  // Torch unknown (2 connections) and the progress reporter's (1), per rank of the job.
  EXPECT_EQ(master - other, 32 * 3);
  // Through a rendezvous any node may become the master: each counts the most ranks it may serve.
  LaunchConfig elastic = parsed(
      {"--nnodes", "2:4", "-n", "8", "--rdzv-backend", "c10d", "--rdzv-endpoint", "head:29400"});
  EXPECT_GE(descriptors_needed(elastic, plan_of(8, 8, 0), false), master);
}

// What `ss -tnp` showed against the store of a two-rank gloo job: each torch 2.13 rank held one
// connection to it, each torch 1.13 rank two; mcprun's progress reporter opens one more.
TEST(DescriptorBudget, TheStoreHostCountsWhatTheWorkersTorchOpens) {
  EXPECT_EQ(torch_store_connections(TorchVersion{2, 13, "2.13.0"}), 1);
  EXPECT_EQ(torch_store_connections(TorchVersion{2, 1, "2.1.0"}), 1);
  EXPECT_EQ(torch_store_connections(TorchVersion{2, 0, "2.0.1"}), 2);
  EXPECT_EQ(torch_store_connections(TorchVersion{1, 13, "1.13.0"}), 2);
  EXPECT_EQ(torch_store_connections(std::nullopt), 2);

  RankPlan torch2 = plan_of(8, 1024, 0), torch1 = plan_of(8, 1024, 0);
  torch2.torch = TorchVersion{2, 13, "2.13.0"};
  torch1.torch = TorchVersion{1, 13, "1.13.0"};
  const LaunchConfig watched = parsed({"--nnodes", "128", "-n", "8", "--master-addr", "10.0.0.1"});
  const LaunchConfig unwatched = parsed(
      {"--nnodes", "128", "-n", "8", "--master-addr", "10.0.0.1", "--collective-timeout", "off"});
  EXPECT_EQ(descriptors_needed(watched, torch1, false) - descriptors_needed(watched, torch2, false),
            1024);
  EXPECT_EQ(
      descriptors_needed(watched, torch2, false) - descriptors_needed(unwatched, torch2, false),
      1024 * kProgressReporterDescriptors);
}

TEST(DescriptorBudget, StackDumpsAndLogFilesCost) {
  const RankPlan plan = plan_of(100);
  const long plain = descriptors_needed(parsed({"-n", "100"}), plan, false);
  EXPECT_EQ(descriptors_needed(parsed({"-n", "100"}), plan, true) - plain,
            100 * kLogFileDescriptors);
  EXPECT_LT(descriptors_needed(parsed({"-n", "100", "--no-stack-dumps"}), plan, false), plain);
}

TEST(DescriptorBudget, AJobOverTheLimitIsRefusedInOneLine) {
  LaunchConfig config = parsed({"-n", "5000"});
  const RankPlan plan = plan_of(5000);
  const long needed = descriptors_needed(config, plan, false);
  EXPECT_TRUE(check_descriptor_limit(config, plan, needed, 1048576));  // Common hard limits.
  EXPECT_TRUE(check_descriptor_limit(config, plan, needed, needed));
  auto refused = check_descriptor_limit(config, plan, needed, 20000);
  ASSERT_FALSE(refused);
  const std::string& message = refused.error().message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  const std::string count = std::to_string(needed);
  for (const std::string& part :
       {"-n 5000 needs up to " + count + " open files", std::string("limit of 20000"),
        std::string("ulimit -n"), std::string("ulimit -Hn"), "ulimit -Hn " + count})
    EXPECT_NE(message.find(part), std::string::npos) << part << " in: " << message;
  // A word for -n names the count it came to.
  LaunchConfig gpus = parsed({"-n", "gpu"});
  auto per_gpu = check_descriptor_limit(gpus, plan_of(8), 100, 64);
  ASSERT_FALSE(per_gpu);
  EXPECT_NE(per_gpu.error().message.find("-n gpu (8 workers) needs up to 100"), std::string::npos)
      << per_gpu.error().message;
  // Eight ranks fit the usual soft limit of 1024, even before it is raised.
  EXPECT_LE(descriptors_needed(parsed({"-n", "8"}), plan_of(8), true), 1024);
}

}  // namespace
}  // namespace mcprun
