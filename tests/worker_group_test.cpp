// WorkerGroup's supervision policy against a fake OS: which rank is the root cause, who was
// stopped by mcprun, how an attempt ends, and the signals sent, in order, to stop the group.
#include "launcher/supervise/worker_group.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <boost/asio/post.hpp>
#include <chrono>
#include <optional>
#include <vector>

#include "tests/fake_process_control.hpp"
#include "tests/temp_dir.hpp"

namespace mcprun {
namespace {

using testing::FakeEnding;
using testing::FakeProcessControl;
using testing::SentSignal;
using testing::TempDir;
using testing::to_group;
using testing::to_orphans;
using testing::to_process;
using End = AttemptResult::End;

/// Long enough that no test passes by waiting it out: a test that needs the grace period to run
/// out sets a short one itself.
constexpr double kGraceNoTestWaitsFor = 60;

class WorkerGroupTest : public ::testing::Test {
 protected:
  WorkerGroupTest() {
    config_.term_timeout = kGraceNoTestWaitsFor;
    set_ranks(2);
  }

  void set_ranks(int count) {
    plan_.argv = {"/usr/bin/python3", "-u", "train.py"};
    plan_.job.run_id = "job";
    plan_.job.local_world_size = plan_.job.world_size = count;
    plan_.slots.clear();
    for (int local_rank = 0; local_rank < count; ++local_rank) {
      RankSlot slot;
      slot.identity.local_rank = slot.identity.rank = local_rank;
      plan_.slots.push_back(slot);
    }
  }

  WorkerGroup& group() {
    if (!group_) group_.emplace(io_, fake_, plan_, config_, inherited_);
    return *group_;
  }

  /// Runs `action` on the attempt's event loop once every worker has been started.
  void once_started(std::function<void()> action) { boost::asio::post(io_, std::move(action)); }

  AttemptResult run_attempt(int restart_count = 0) {
    WorkerGroup& workers = group();
    const AttemptFiles files{dir_ / ("attempt_" + std::to_string(restart_count)), false};
    return workers.run_attempt(restart_count, files);
  }

  /// The pid fake spawn number `index` got.
  pid_t pid(size_t index) const {
    return FakeProcessControl::kFirstPid + static_cast<pid_t>(index);
  }

  /// SIGNAL to every worker's group, then to the orphans: how WorkerGroup reaches everything.
  std::vector<SentSignal> to_everything(int signal, const std::vector<pid_t>& leaders) const {
    std::vector<SentSignal> sent;
    for (pid_t leader : leaders) sent.push_back(to_group(leader, signal));
    sent.push_back(to_orphans(signal));
    return sent;
  }

  static std::vector<SentSignal> then(std::vector<SentSignal> first,
                                      const std::vector<SentSignal>& second) {
    first.insert(first.end(), second.begin(), second.end());
    return first;
  }

  TempDir dir_{"worker_group_test"};
  boost::asio::io_context io_;
  FakeProcessControl fake_;
  LaunchConfig config_;
  RankPlan plan_;
  Environment inherited_;
  std::optional<WorkerGroup> group_;
};

TEST_F(WorkerGroupTest, EveryRankExitingZeroSucceedsWithoutASignal) {
  once_started([&] {
    fake_.exit(pid(0), 0);
    fake_.exit(pid(1), 0);
  });
  const AttemptResult result = run_attempt();
  EXPECT_EQ(result.end, End::kSucceeded);
  ASSERT_EQ(result.workers.size(), 2u);
  for (const WorkerOutcome& worker : result.workers) {
    EXPECT_FALSE(worker.failed());
    EXPECT_FALSE(worker.stopped_by_launcher);
  }
  EXPECT_EQ(result.workers[1].rank, 1);
  EXPECT_EQ(result.workers[1].pid, pid(1));
  EXPECT_TRUE(fake_.signals().empty());
  EXPECT_TRUE(fake_.all_reaped());
}

TEST_F(WorkerGroupTest, EachWorkerIsSpawnedWithItsRankAndTheRestartCount) {
  once_started([&] {
    fake_.exit(pid(0), 0);
    fake_.exit(pid(1), 0);
  });
  run_attempt(/*restart_count=*/3);
  ASSERT_EQ(fake_.spawned().size(), 2u);
  EXPECT_EQ(fake_.process(pid(1)).request.argv, plan_.argv);
  EXPECT_EQ(fake_.env(pid(1), "RANK"), "1");
  EXPECT_EQ(fake_.env(pid(1), "LOCAL_RANK"), "1");
  EXPECT_EQ(fake_.env(pid(1), "TORCHELASTIC_RESTART_COUNT"), "3");
}

TEST_F(WorkerGroupTest, FirstFailureStopsEveryGroupWithSigtermThenSigcont) {
  once_started([&] { fake_.exit(pid(1), 3); });
  const AttemptResult result = run_attempt();
  EXPECT_EQ(result.end, End::kWorkerFailed);
  EXPECT_EQ(result.first_failure, 1u);
  EXPECT_EQ(result.workers[1].exit_code, 3);
  EXPECT_FALSE(result.workers[1].stopped_by_launcher);
  EXPECT_EQ(result.workers[0].signal, SIGTERM);
  EXPECT_TRUE(result.workers[0].stopped_by_launcher);
  // The exited leader's group too: it may still hold grandchildren.
  EXPECT_EQ(fake_.signals(), then(to_everything(SIGTERM, {pid(0), pid(1)}),
                                  to_everything(SIGCONT, {pid(0), pid(1)})));
  EXPECT_TRUE(fake_.all_reaped());
}

TEST_F(WorkerGroupTest, FailureListenerHearsTheRootCauseBeforeAnySignalIsSent) {
  std::vector<int> failed_ranks;
  size_t signals_before = 99;
  group().on_first_failure([&](const WorkerOutcome& worker) {
    failed_ranks.push_back(worker.rank);
    signals_before = fake_.signals().size();
  });
  once_started([&] { fake_.exit(pid(0), 1); });
  run_attempt();
  EXPECT_EQ(failed_ranks, std::vector<int>{0});
  EXPECT_EQ(signals_before, 0u);
}

TEST_F(WorkerGroupTest, AWorkerKilledBySignalNobodySentIsTheRootCause) {
  once_started([&] { fake_.die(pid(0), SIGSEGV); });
  const AttemptResult result = run_attempt();
  EXPECT_EQ(result.end, End::kWorkerFailed);
  EXPECT_EQ(result.first_failure, 0u);
  EXPECT_EQ(result.workers[0].signal, SIGSEGV);
  EXPECT_FALSE(result.workers[0].stopped_by_launcher);
  EXPECT_TRUE(result.workers[1].stopped_by_launcher);
}

TEST_F(WorkerGroupTest, WhileStoppingOnlyAnExitCodeOfItsOwnCountsAsAFailure) {
  set_ranks(4);
  once_started([&] {
    fake_.on_signal(pid(1), SIGTERM, FakeEnding::exits(7));    // Its own crash, landing late.
    fake_.on_signal(pid(2), SIGTERM, FakeEnding::exits(143));  // Python's handler: 128 + SIGTERM.
    fake_.on_signal(pid(3), SIGTERM, FakeEnding::exits(0));    // A clean shutdown on request.
    fake_.exit(pid(0), 1);
  });
  const AttemptResult result = run_attempt();
  EXPECT_EQ(result.end, End::kWorkerFailed);
  EXPECT_EQ(result.first_failure, 0u);
  EXPECT_FALSE(result.workers[0].stopped_by_launcher);
  EXPECT_FALSE(result.workers[1].stopped_by_launcher);
  EXPECT_EQ(result.workers[1].exit_code, 7);
  EXPECT_TRUE(result.workers[2].stopped_by_launcher);
  EXPECT_TRUE(result.workers[3].stopped_by_launcher);
}

TEST_F(WorkerGroupTest, WorkersIgnoringSigtermGetSigkillOnceTheGracePeriodIsOver) {
  config_.term_timeout = 0.05;
  fake_.on_signal(SIGTERM, std::nullopt);
  std::optional<std::chrono::steady_clock::time_point> sigterm_at, sigkill_at;
  fake_.after_signal = [&](const SentSignal& sent) {
    if (sent.signal == SIGTERM && !sigterm_at) sigterm_at = std::chrono::steady_clock::now();
    if (sent.signal == SIGKILL && !sigkill_at) sigkill_at = std::chrono::steady_clock::now();
  };
  once_started([&] { fake_.exit(pid(0), 1); });
  const AttemptResult result = run_attempt();
  EXPECT_EQ(result.end, End::kWorkerFailed);
  EXPECT_EQ(fake_.signals(), then(then(to_everything(SIGTERM, {pid(0), pid(1)}),
                                       to_everything(SIGCONT, {pid(0), pid(1)})),
                                  to_everything(SIGKILL, {pid(0), pid(1)})));
  ASSERT_TRUE(sigterm_at && sigkill_at);
  EXPECT_GE(*sigkill_at - *sigterm_at, std::chrono::milliseconds(50));
  EXPECT_EQ(result.workers[1].signal, SIGKILL);
  EXPECT_TRUE(result.workers[1].stopped_by_launcher);
  EXPECT_TRUE(fake_.all_reaped());
}

TEST_F(WorkerGroupTest, AnOrphanIsStoppedAndReapedBeforeTheAttemptEnds) {
  config_.term_timeout = 0.05;
  pid_t orphan = 0;
  once_started([&] {
    orphan = fake_.adopt_orphan();  // A grandchild whose parent, a worker, exits now.
    fake_.on_signal(orphan, SIGTERM, std::nullopt);
    fake_.exit(pid(0), 0);
    fake_.exit(pid(1), 0);
  });
  const AttemptResult result = run_attempt();
  EXPECT_EQ(result.end, End::kSucceeded);
  EXPECT_EQ(fake_.signals(), then(then(to_everything(SIGTERM, {pid(0), pid(1)}),
                                       to_everything(SIGCONT, {pid(0), pid(1)})),
                                  to_everything(SIGKILL, {pid(0), pid(1)})));
  EXPECT_EQ(fake_.process(orphan).ended->signal, SIGKILL);
  EXPECT_TRUE(fake_.all_reaped());
}

TEST_F(WorkerGroupTest, ASignalToMcprunIsForwardedOnceAndEndsTheAttemptInterrupted) {
  once_started([] { ::raise(SIGTERM); });
  const AttemptResult result = run_attempt();
  EXPECT_EQ(result.end, End::kInterrupted);
  EXPECT_EQ(result.interrupt_signal, SIGTERM);
  EXPECT_EQ(fake_.signals(), then(to_everything(SIGTERM, {pid(0), pid(1)}),
                                  to_everything(SIGCONT, {pid(0), pid(1)})));
  for (const WorkerOutcome& worker : result.workers) {
    EXPECT_EQ(worker.signal, SIGTERM);
    EXPECT_TRUE(worker.stopped_by_launcher);
  }
}

TEST_F(WorkerGroupTest, ASecondInterruptSendsSigkillWithoutWaitingForTheGracePeriod) {
  fake_.on_signal(SIGTERM, std::nullopt);
  fake_.after_signal = [](const SentSignal& sent) {
    if (sent == to_orphans(SIGCONT)) ::raise(SIGINT);  // The user presses Ctrl-C again.
  };
  once_started([] { ::raise(SIGTERM); });
  const auto started = std::chrono::steady_clock::now();
  const AttemptResult result = run_attempt();
  EXPECT_LT(std::chrono::steady_clock::now() - started,
            std::chrono::duration<double>(kGraceNoTestWaitsFor / 2));
  EXPECT_EQ(result.end, End::kInterrupted);
  EXPECT_EQ(result.interrupt_signal, SIGTERM);
  EXPECT_EQ(fake_.signals(), then(then(to_everything(SIGTERM, {pid(0), pid(1)}),
                                       to_everything(SIGCONT, {pid(0), pid(1)})),
                                  to_everything(SIGKILL, {pid(0), pid(1)})));
  EXPECT_TRUE(fake_.all_reaped());
}

TEST_F(WorkerGroupTest, Sigusr1IsForwardedToEveryWorkerWhichKeepsRunning) {
  fake_.on_signal(SIGUSR1, std::nullopt);  // The workers checkpoint on it.
  fake_.after_signal = [&](const SentSignal& sent) {
    if (sent != to_orphans(SIGUSR1)) return;
    fake_.exit(pid(0), 0);
    fake_.exit(pid(1), 0);
  };
  once_started([] { ::raise(SIGUSR1); });
  const AttemptResult result = run_attempt();
  EXPECT_EQ(result.end, End::kSucceeded);
  EXPECT_EQ(fake_.signals(), to_everything(SIGUSR1, {pid(0), pid(1)}));
}

TEST_F(WorkerGroupTest, AFailedSpawnStopsTheRanksAlreadyStarted) {
  fake_.fail_spawn(1, "execvp(train.py): No such file or directory");
  const AttemptResult result = run_attempt();
  EXPECT_EQ(result.end, End::kSpawnFailed);
  EXPECT_EQ(result.spawn_error, "execvp(train.py): No such file or directory");
  EXPECT_EQ(fake_.spawned(), std::vector<pid_t>{pid(0)});
  EXPECT_EQ(result.workers[1].pid, 0);
  EXPECT_EQ(fake_.signals(),
            then(to_everything(SIGTERM, {pid(0)}), to_everything(SIGCONT, {pid(0)})));
  EXPECT_TRUE(fake_.all_reaped());
}

TEST_F(WorkerGroupTest, AnotherNodesStopEndsTheAttemptWithItsReasonAndNoLocalRootCause) {
  bool local_failure_reported = false;
  group().on_first_failure([&](const WorkerOutcome&) { local_failure_reported = true; });
  once_started([&] { group().request_stop("rank 5 on node-b failed with exit code 7", 7); });
  const AttemptResult result = run_attempt();
  EXPECT_EQ(result.end, End::kPeerStopped);
  EXPECT_EQ(result.peer_reason, "rank 5 on node-b failed with exit code 7");
  EXPECT_EQ(result.peer_exit_code, 7);
  EXPECT_FALSE(local_failure_reported);
  for (const WorkerOutcome& worker : result.workers) EXPECT_TRUE(worker.stopped_by_launcher);
  EXPECT_EQ(fake_.signals(), then(to_everything(SIGTERM, {pid(0), pid(1)}),
                                  to_everything(SIGCONT, {pid(0), pid(1)})));
}

StallNotice silence_of_rank(int rank) {
  StallNotice notice;
  notice.kind = StallNotice::Kind::kSilence;
  notice.rank = rank;
  notice.what = "rank " + std::to_string(rank) + " printed nothing for --silence-timeout 1 s";
  return notice;
}

TEST_F(WorkerGroupTest, AStallAsksEachWorkerAloneForPythonTracebacksBeforeStopping) {
  std::vector<std::vector<WorkerStatus>> diagnosed;
  group().on_stall([&](const StallNotice&, const std::vector<WorkerStatus>& workers) {
    diagnosed.push_back(workers);
  });
  once_started([&] { group().request_stall(silence_of_rank(1)); });
  const AttemptResult result = run_attempt();
  EXPECT_EQ(result.end, End::kStalled);
  ASSERT_TRUE(result.stall);
  EXPECT_EQ(result.stall->rank, 1);
  ASSERT_EQ(diagnosed.size(), 1u);
  ASSERT_EQ(diagnosed[0].size(), 2u);
  EXPECT_TRUE(diagnosed[0][0].running && diagnosed[0][1].running);
  // SIGCONT first, so that a stopped worker can print; SIGABRT to the worker alone, not what it
  // started. Every worker died of it, so nothing was left to SIGTERM.
  EXPECT_EQ(fake_.signals(),
            (std::vector<SentSignal>{to_group(pid(0), SIGCONT), to_process(pid(0), SIGABRT),
                                     to_group(pid(1), SIGCONT), to_process(pid(1), SIGABRT)}));
  EXPECT_EQ(result.workers[0].signal, SIGABRT);
  EXPECT_TRUE(result.workers[0].stopped_by_launcher);
  EXPECT_TRUE(fake_.all_reaped());
}

TEST_F(WorkerGroupTest, AStallWithoutStackDumpsStopsTheGroupAtOnce) {
  config_.stack_dumps = false;
  bool diagnosed = false;
  group().on_stall([&](const StallNotice&, const std::vector<WorkerStatus>&) { diagnosed = true; });
  once_started([&] { group().request_stall(silence_of_rank(0)); });
  const AttemptResult result = run_attempt();
  EXPECT_EQ(result.end, End::kStalled);
  EXPECT_TRUE(diagnosed);
  EXPECT_EQ(fake_.signals(), then(to_everything(SIGTERM, {pid(0), pid(1)}),
                                  to_everything(SIGCONT, {pid(0), pid(1)})));
}

TEST_F(WorkerGroupTest, ANewAttemptStartsFromNothingOfTheLastOnes) {
  once_started([&] { fake_.exit(pid(0), 1); });
  EXPECT_EQ(run_attempt(0).end, End::kWorkerFailed);
  once_started([&] {
    fake_.exit(pid(2), 0);
    fake_.exit(pid(3), 0);
  });
  const AttemptResult second = run_attempt(1);
  EXPECT_EQ(second.end, End::kSucceeded);
  EXPECT_EQ(second.workers[0].pid, pid(2));
  EXPECT_FALSE(second.workers[0].stopped_by_launcher);
  EXPECT_EQ(fake_.env(pid(2), "TORCHELASTIC_RESTART_COUNT"), "1");
}

TEST_F(WorkerGroupTest, TheGroupStopsListeningForExitsWhenItIsGone) {
  group();
  EXPECT_TRUE(fake_.has_exit_listener());
  group_.reset();
  EXPECT_FALSE(fake_.has_exit_listener());
}

}  // namespace
}  // namespace mcprun
