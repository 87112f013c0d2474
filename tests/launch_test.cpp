// A whole single-node Launch against a fake OS: mcprun's exit code for each ending, and how many
// times --max-restarts runs the group. No worker process starts; the job store and the watchdogs
// are real, on this host only.
#include "launcher/launch.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <set>
#include <string>
#include <vector>

#include "common/exit_status.hpp"
#include "tests/fake_process_control.hpp"
#include "tests/temp_dir.hpp"

namespace mcprun {
namespace {

using testing::FakeProcessControl;
using testing::TempDir;

class LaunchTest : public ::testing::Test {
 protected:
  LaunchTest() {
    // No GPU lease from a rendezvousd that this box may run: the launch takes what it finds.
    ::setenv("MCPRUN_DAEMON", "", 1);
  }

  /// Two unpinned ranks of an executable (never started), with the run's folder under the test's.
  LaunchConfig configure(std::vector<std::string> flags) {
    std::vector<std::string> args{"--no-slurm",        "--no-python", "--no-pin",
                                  "--nproc-per-node",  "2",           "--log-dir",
                                  dir_.path().string()};
    args.insert(args.end(), flags.begin(), flags.end());
    args.push_back("/bin/true");
    auto parsed = parse_launch_config(args);
    if (!parsed) ADD_FAILURE() << parsed.error().message;
    return std::get<LaunchConfig>(*parsed);
  }

  int run(const LaunchConfig& config) {
    RunSummary summary(config, "test-host");
    return Launch(config, summary, fake_).run();
  }

  /// Each spawn's TORCHELASTIC_RESTART_COUNT, in spawn order.
  std::vector<std::string> restart_counts() const {
    std::vector<std::string> counts;
    for (pid_t pid : fake_.spawned())
      counts.push_back(fake_.env(pid, "TORCHELASTIC_RESTART_COUNT").value_or("unset"));
    return counts;
  }

  /// Makes every worker exit 0 the moment it starts.
  void every_worker_succeeds() {
    fake_.after_spawn = [this](pid_t pid, size_t) { fake_.exit(pid, 0); };
  }

  TempDir dir_{"launch_test"};
  FakeProcessControl fake_;
};

TEST_F(LaunchTest, EveryWorkerExitingZeroExitsZero) {
  every_worker_succeeds();
  EXPECT_EQ(run(configure({})), kExitSuccess);
  EXPECT_EQ(fake_.spawned().size(), 2u);
  EXPECT_TRUE(fake_.signals().empty());
  EXPECT_TRUE(fake_.all_reaped());
}

TEST_F(LaunchTest, AFailingWorkersOwnExitCodeIsMcprunsExitCode) {
  fake_.after_spawn = [this](pid_t pid, size_t index) {
    if (index == 1) fake_.exit(pid, 5);
  };
  EXPECT_EQ(run(configure({})), 5);
  EXPECT_EQ(fake_.spawned().size(), 2u);  // No restart without --max-restarts.
  EXPECT_EQ(fake_.signals_to(fake_.spawned()[0]).front(), SIGTERM);
  EXPECT_TRUE(fake_.all_reaped());
}

TEST_F(LaunchTest, MaxRestartsRunsTheGroupThatManyMoreTimesThenExitsWithTheFailure) {
  fake_.after_spawn = [this](pid_t pid, size_t index) {
    if (index % 2 == 0) fake_.exit(pid, 4);  // Local rank 0 fails in every attempt.
  };
  EXPECT_EQ(run(configure({"--max-restarts", "2"})), 4);
  EXPECT_EQ(restart_counts(), (std::vector<std::string>{"0", "0", "1", "1", "2", "2"}));
  // One store for the whole job, renewed for each attempt on the same MASTER_PORT.
  std::set<std::string> master_ports;
  for (pid_t pid : fake_.spawned()) master_ports.insert(fake_.env(pid, "MASTER_PORT").value_or(""));
  EXPECT_EQ(master_ports.size(), 1u);
}

TEST_F(LaunchTest, ARestartThatSucceedsExitsZero) {
  fake_.after_spawn = [this](pid_t pid, size_t index) { fake_.exit(pid, index == 1 ? 9 : 0); };
  EXPECT_EQ(run(configure({"--max-restarts", "3"})), kExitSuccess);
  EXPECT_EQ(restart_counts(), (std::vector<std::string>{"0", "0", "1", "1"}));
}

TEST_F(LaunchTest, ASignalToMcprunExitsWith128PlusIt) {
  fake_.after_spawn = [](pid_t, size_t index) {
    if (index == 1) ::raise(SIGINT);
  };
  EXPECT_EQ(run(configure({"--max-restarts", "3"})), exit_code_for_signal(SIGINT));
  EXPECT_EQ(fake_.spawned().size(), 2u);  // An interrupt spends no restart.
}

TEST_F(LaunchTest, SigtermUnderSlurmIsSlurmsCancel) {
  LaunchConfig config = configure({});
  config.under_slurm = true;
  fake_.after_spawn = [](pid_t, size_t index) {
    if (index == 1) ::raise(SIGTERM);
  };
  EXPECT_EQ(run(config), kExitSlurmCancelled);
}

TEST_F(LaunchTest, AWorkerDyingOfSlurmsSigtermFirstIsSlurmsCancelToo) {
  LaunchConfig config = configure({});
  config.under_slurm = true;
  fake_.after_spawn = [this](pid_t pid, size_t index) {
    if (index == 0) fake_.die(pid, SIGTERM);
  };
  EXPECT_EQ(run(config), kExitSlurmCancelled);
}

TEST_F(LaunchTest, AStallExitsThreeAndKeepsItsReport) {
  // Fake workers never print: the silence watchdog fires once its timeout has passed.
  EXPECT_EQ(run(configure({"--silence-timeout", "0.1", "--no-stack-dumps"})), kExitStalled);
  bool report_kept = false;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir_.path()))
    report_kept |= entry.path().filename() == "stall_report.txt";
  EXPECT_TRUE(report_kept);
  EXPECT_TRUE(fake_.all_reaped());
}

TEST_F(LaunchTest, TheJobTimeoutExits124) {
  EXPECT_EQ(run(configure({"--timeout", "0.1", "--max-restarts", "3"})), kExitJobTimeout);
  EXPECT_EQ(fake_.spawned().size(), 2u);  // The deadline is the job's: no restart after it.
}

TEST_F(LaunchTest, AWorkerThatCannotStartExitsOne) {
  fake_.fail_spawn(0, "execvp(/bin/true): Permission denied");
  EXPECT_EQ(run(configure({"--max-restarts", "3"})), kExitFailure);
  EXPECT_TRUE(fake_.spawned().empty());
}

}  // namespace
}  // namespace mcprun
