#include "launcher/config/slurm.hpp"

#include <gtest/gtest.h>

#include <cstdlib>

namespace mcprun {
namespace {

std::vector<std::string> hosts(std::string_view text) {
  auto expanded = expand_hostlist(text);
  if (!expanded) {
    ADD_FAILURE() << expanded.error().message;
    return {};
  }
  return *expanded;
}

using Hosts = std::vector<std::string>;

// Each expected list is what `scontrol show hostnames` printed for the same input (Slurm 22.05).
TEST(Hostlist, RangesAndSingles) {
  EXPECT_EQ(hosts("n[1-2]"), (Hosts{"n1", "n2"}));
  EXPECT_EQ(hosts("n1"), (Hosts{"n1"}));
  EXPECT_EQ(hosts("n[2,1,1]"), (Hosts{"n2", "n1", "n1"}));
  EXPECT_EQ(hosts("n[9-11]"), (Hosts{"n9", "n10", "n11"}));
}

TEST(Hostlist, ZeroPaddingIsTheLowBoundsWidth) {
  EXPECT_EQ(hosts("gpu-[01-04,07]"), (Hosts{"gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-07"}));
  EXPECT_EQ(hosts("x[001-3]"), (Hosts{"x001", "x002", "x003"}));
  EXPECT_EQ(hosts("n[08-10]"), (Hosts{"n08", "n09", "n10"}));
}

TEST(Hostlist, SeveralBracketsMultiplyOut) {
  EXPECT_EQ(hosts("a[1-2]-b[3-4]"), (Hosts{"a1-b3", "a1-b4", "a2-b3", "a2-b4"}));
}

TEST(Hostlist, CommaSeparatedGroups) {
  EXPECT_EQ(hosts("n1,gpu[1-2],x"), (Hosts{"n1", "gpu1", "gpu2", "x"}));
  EXPECT_EQ(hosts("n[1-2],n[2-3]"), (Hosts{"n1", "n2", "n2", "n3"}));
  EXPECT_EQ(hosts("n1 n2"), (Hosts{"n1", "n2"}));
}

TEST(Hostlist, WhatSlurmRefusesIsAnError) {
  for (const char* bad : {"n[3-1]", "n[]", "n[1-2]x", "n[1-3", "", "n[a-b]"})
    EXPECT_FALSE(expand_hostlist(bad)) << bad;
}

TEST(TasksPerNode, RepeatsExpand) {
  EXPECT_EQ(*expand_tasks_per_node("8(x2),4"), (std::vector<int>{8, 8, 4}));
  EXPECT_EQ(*expand_tasks_per_node("1"), (std::vector<int>{1}));
  EXPECT_FALSE(expand_tasks_per_node("2(x"));
}

/// A two-node step's environment, as srun --ntasks-per-node=1 sets it on node 1.
Environment second_node() {
  return {{"SLURM_JOB_ID", "4242"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_NNODES", "2"},
          {"SLURM_NODEID", "1"},
          {"SLURM_STEP_NODELIST", "gpu-[07-08]"},
          {"SLURM_JOB_NODELIST", "gpu-[07-08]"},
          {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
          {"SLURM_STEP_NUM_TASKS", "2"},
          {"SLURM_CONF", "/nonexistent"}};
}

std::optional<std::string> fake_resolve(const std::string& host) {
  return host == "gpu-07" ? std::optional<std::string>("10.0.0.7") : std::nullopt;
}

ExplicitFlag none_set() {
  return [](const std::string&) { return false; };
}

TEST(Slurm, StaticPlanFromTheStep) {
  LaunchConfig config;
  ASSERT_TRUE(apply_slurm(config, second_node(), none_set(), fake_resolve));
  EXPECT_TRUE(config.under_slurm);
  EXPECT_EQ(config.nnodes, "2");
  EXPECT_EQ(config.node_rank, 1);
  EXPECT_EQ(config.rdzv_id, "4242.0");
  EXPECT_EQ(config.master_addr, "10.0.0.7");
  EXPECT_EQ(config.master_port, kSlurmPortBase + 4242);
  EXPECT_EQ(config.term_timeout, 10);  // Slurm's default KillWait 30 s leaves it alone.
  ASSERT_EQ(config.notes.size(), 1u);
  EXPECT_NE(config.notes[0].find("master 10.0.0.7 (gpu-07)"), std::string::npos) << config.notes[0];
}

TEST(Slurm, WhatTheUserSetWins) {
  LaunchConfig config;
  config.master_addr = "192.168.1.1";
  config.master_port = 1234;
  ExplicitFlag set = [](const std::string& flag) {
    return flag == "master-addr" || flag == "master-port";
  };
  ASSERT_TRUE(apply_slurm(config, second_node(), set, fake_resolve));
  EXPECT_EQ(config.master_addr, "192.168.1.1");
  EXPECT_EQ(config.master_port, 1234);
  EXPECT_EQ(config.nnodes, "2");
}

TEST(Slurm, RendezvousHostedByTheFirstNode) {
  LaunchConfig config;
  config.rdzv_backend = "c10d";
  Environment env = second_node();
  ASSERT_TRUE(apply_slurm(config, env, none_set(), fake_resolve));
  EXPECT_EQ(config.rdzv_endpoint, "10.0.0.7:" + std::to_string(kSlurmPortBase + 4242));
  EXPECT_EQ(config.is_host, false);
  env["SLURM_NODEID"] = "0";
  LaunchConfig first;
  first.rdzv_backend = "c10d";
  ASSERT_TRUE(apply_slurm(first, env, none_set(), fake_resolve));
  EXPECT_EQ(first.is_host, true);
}

TEST(Slurm, MoreThanOneTaskPerNodeIsRefused) {
  for (auto [name, value] :
       {std::pair{"SLURM_STEP_TASKS_PER_NODE", "8(x2)"}, std::pair{"SLURM_STEP_NUM_TASKS", "16"}}) {
    Environment env = second_node();
    env[name] = value;
    LaunchConfig config;
    auto applied = apply_slurm(config, env, none_set(), fake_resolve);
    ASSERT_FALSE(applied) << name;
    const std::string& error = applied.error().message;
    EXPECT_NE(error.find("srun --ntasks-per-node=1 mcprun"), std::string::npos) << error;
  }
}

TEST(Slurm, OffWithoutAStepOrWhenAskedTo) {
  Environment env = second_node();
  env.erase("SLURM_STEP_ID");
  LaunchConfig config;
  ASSERT_TRUE(apply_slurm(config, env, none_set(), fake_resolve));
  EXPECT_FALSE(config.under_slurm);
  env = second_node();
  env["MCPRUN_SLURM"] = "0";
  ASSERT_TRUE(apply_slurm(config, env, none_set(), fake_resolve));
  EXPECT_FALSE(config.under_slurm);
  config.no_slurm = true;
  ASSERT_TRUE(apply_slurm(config, second_node(), none_set(), fake_resolve));
  EXPECT_FALSE(config.under_slurm);
  EXPECT_EQ(config.nnodes, "1");
}

TEST(Slurm, GrantedGpusBecomeTheAllowedSet) {
  Environment env = second_node();
  env["SLURM_STEP_GPUS"] = "2,3";
  LaunchConfig config;
  ASSERT_TRUE(apply_slurm(config, env, none_set(), fake_resolve));
  EXPECT_EQ(config.gpus, "2,3");
  env["CUDA_VISIBLE_DEVICES"] = "0,1";  // The gres plugin's own: rank_plan reads it inherited.
  LaunchConfig gres;
  ASSERT_TRUE(apply_slurm(gres, env, none_set(), fake_resolve));
  EXPECT_FALSE(gres.gpus);
}

TEST(Slurm, SigtermGraceFitsInKillWait) {
  Environment env = second_node();
  env["SLURM_KILL_WAIT"] = "5";
  LaunchConfig config;
  ASSERT_TRUE(apply_slurm(config, env, none_set(), fake_resolve));
  EXPECT_EQ(config.term_timeout, 5 - kSlurmKillWaitMargin);
  EXPECT_EQ(slurm_kill_wait({{"SLURM_CONF", MCPRUN_SOURCE_DIR "/tests/slurm_test_killwait.conf"}}),
            7);
}

}  // namespace
}  // namespace mcprun
