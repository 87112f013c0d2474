#include "common/process_state.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>

namespace mcprun {
namespace {

// A stopped sleep's /proc/PID/stat and wchan on this machine's kernel (Debian 12, 6.1).
constexpr const char* kStoppedStat =
    "18620 (sleep) T 18613 18613 1197 0 -1 4194560 93 0 0 0 0 0 0 0 20 0 1 0 12062 5578752 222";
// The same line as a python3 rank blocked on a FUSE file system that never answers shows it,
// with the wchan FUSE's request path waits in (fs/fuse/dev.c).
constexpr const char* kUninterruptibleStat =
    "4242 (python3) D 4200 4242 4200 0 -1 4194560 8120 0 0 0 310 41 0 0 20 0 9 0 77124 ...";

TEST(ProcessState, StoppedIsNamedAsStopped) {
  const auto state = parse_run_state(kStoppedStat, "do_signal_stop");
  ASSERT_TRUE(state);
  EXPECT_EQ(state->state, 'T');
  EXPECT_EQ(state->wchan, "do_signal_stop");
  const auto words = describe_not_running(*state);
  ASSERT_TRUE(words);
  EXPECT_NE(words->find("stopped (state T"), std::string::npos) << *words;
}

TEST(ProcessState, UninterruptibleSleepNamesTheKernelFunction) {
  const auto state = parse_run_state(kUninterruptibleStat, "request_wait_answer\n");
  ASSERT_TRUE(state);
  const auto words = describe_not_running(*state);
  ASSERT_TRUE(words);
  EXPECT_NE(words->find("uninterruptible sleep (state D in request_wait_answer)"),
            std::string::npos)
      << *words;
}

TEST(ProcessState, CpuTimeIsUserAndSystemTicks) {
  const auto state = parse_run_state(kUninterruptibleStat, "request_wait_answer\n");
  ASSERT_TRUE(state);
  EXPECT_DOUBLE_EQ(state->cpu_s, (310.0 + 41.0) / static_cast<double>(sysconf(_SC_CLK_TCK)));
}

TEST(ProcessState, SchedstatIsSecondsOnACpuAndWaitingForOne) {
  const auto times = parse_schedstat("91745723 22555275 239\n");
  ASSERT_TRUE(times);
  EXPECT_DOUBLE_EQ(times->first, 0.091745723);
  EXPECT_DOUBLE_EQ(times->second, 0.022555275);
  EXPECT_FALSE(parse_schedstat(""));
  EXPECT_FALSE(parse_schedstat("91745723"));
  EXPECT_FALSE(parse_schedstat("x 1 2"));
}

TEST(ProcessState, IoBytesAreReadPlusWritten) {
  EXPECT_EQ(parse_io_bytes("rchar: 85342\nwchar: 4100\nsyscr: 23684\nsyscw: 168\nread_bytes: 0\n"),
            85342 + 4100);
  EXPECT_FALSE(parse_io_bytes("rchar: 85342\n"));  // No wchar: not counted, not zero.
  EXPECT_FALSE(parse_io_bytes("rchar: many\nwchar: 1\n"));
}

TEST(ProcessState, AComputingProcessRunsOrWaitsToRunAndASleepingOneDoesNeither) {
  auto start = [](bool compute) {
    const pid_t child = fork();
    if (child == 0) {
      volatile uint64_t count = 0;
      while (compute) count = count + 1;
      pause();
      _exit(0);
    }
    return child;
  };
  const pid_t computing = start(true), sleeping = start(false);
  ASSERT_GT(computing, 0);
  ASSERT_GT(sleeping, 0);
  // The sleeper's way from fork to pause() is CPU time, and on a loaded box a wait for a CPU:
  // counted from once it sleeps.
  const auto asleep_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < asleep_by) {
    const auto state = read_run_state(sleeping);
    if (state && state->state == 'S') break;
    timespec poll{0, 1'000'000};
    nanosleep(&poll, nullptr);
  }
  const auto computing_before = read_process_activity(computing);
  const auto sleeping_before = read_process_activity(sleeping);
  timespec pause_for{0, 300'000'000};
  nanosleep(&pause_for, nullptr);
  const auto computing_after = read_process_activity(computing);
  const auto sleeping_after = read_process_activity(sleeping);
  for (pid_t child : {computing, sleeping}) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  }
  ASSERT_TRUE(computing_before && computing_after && sleeping_before && sleeping_after);
  EXPECT_FALSE(read_process_activity(computing));  // Reaped: gone.
  if (computing_after->main_run_s < 0) GTEST_SKIP() << "this kernel keeps no schedstats";
  auto run_or_wait = [](const ProcessActivity& before, const ProcessActivity& after) {
    return (after.main_run_s - before.main_run_s) +
           (after.main_run_delay_s - before.main_run_delay_s);
  };
  // On a CPU or waiting for one for most of the pause, however loaded the box; the sleeper
  // neither, however loaded.
  EXPECT_GT(run_or_wait(*computing_before, *computing_after), 0.2);
  EXPECT_LT(run_or_wait(*sleeping_before, *sleeping_after), 0.01);
}

TEST(ProcessState, CgroupFreezerIsNamed) {
  const auto state = parse_run_state("77 (python3) S 1 77 77 0 -1", "do_freezer_trap");
  ASSERT_TRUE(state);
  EXPECT_EQ(describe_not_running(*state), "frozen by its cgroup's freezer (cgroup.freeze)");
}

TEST(ProcessState, RunningAndSleepingProcessesCanRun) {
  for (const char* stat : {"7 (python3) R 1 7", "7 (python3) S 1 7"}) {
    const auto state = parse_run_state(stat, "0");
    ASSERT_TRUE(state) << stat;
    EXPECT_EQ(state->wchan, "");
    EXPECT_FALSE(describe_not_running(*state)) << stat;
  }
}

TEST(ProcessState, ACommandNameWithParenthesesAndStatesDoesNotFoolTheParser) {
  const auto state = parse_run_state("9 (a) T (b) R 1 9 9", "0");
  ASSERT_TRUE(state);
  EXPECT_EQ(state->state, 'R');
}

TEST(ProcessState, TextThatIsNoStatLineIsRefused) {
  EXPECT_FALSE(parse_run_state("", ""));
  EXPECT_FALSE(parse_run_state("12 (python3", ""));
  EXPECT_FALSE(parse_run_state("12 (python3)", ""));
}

TEST(ProcessState, ARealStoppedChildReadsAsStoppedAndAGoneOneAsNothing) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  ASSERT_EQ(kill(child, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, WUNTRACED), child);  // Returns once it is stopped.
  ASSERT_TRUE(WIFSTOPPED(status));
  const auto state = read_run_state(child);
  ASSERT_TRUE(state);
  EXPECT_EQ(state->state, 'T');
  kill(child, SIGKILL);
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_FALSE(read_run_state(child));
}

}  // namespace
}  // namespace mcprun
