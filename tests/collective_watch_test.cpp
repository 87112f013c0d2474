#include "launcher/watch/collective_watch.hpp"

#include <gtest/gtest.h>

namespace mcprun {
namespace {

using Clock = CollectiveWatch::Clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr double kTimeout = 10;

PendingCollective call(std::string op, int64_t seq, std::string group = "0",
                       std::vector<int> ranks = {0, 1, 2}) {
  return {std::move(group), std::move(ranks), std::move(op), seq, "gloo", 0};
}

/// Feeds records the way reporters send them: one per rank per second.
class Job {
 public:
  explicit Job(int world) : world_(world), watch_(kTimeout, 1.0, now_), numbers_(world, 0) {}

  /// Every rank reports once; `state(rank, record)` fills its record for this second.
  template <class Fill>
  void second(Fill fill) {
    now_ += seconds(1);
    for (int rank = 0; rank < world_; ++rank) {
      ProgressRecord record;
      record.rank = rank;
      record.pid = 100 + rank;
      record.number = ++numbers_[rank];
      record.source = "flight_recorder";
      record.frames = {"train.py:40 in main", "train.py:12 in step"};
      if (!fill(rank, record)) continue;
      // A reporter ages each call it keeps seeing pending; a test's explicit age stands.
      for (PendingCollective& pending : record.pending) {
        const auto first =
            first_pending_.try_emplace(std::to_string(rank) + describe(pending), now_);
        if (pending.pending_s == 0)
          pending.pending_s = std::chrono::duration<double>(now_ - first.first->second).count();
      }
      watch_.observe(std::move(record), now_);
    }
  }
  /// One second of rank 0 waiting at barrier #5 while rank 1, silent after its first two
  /// records (a call that holds the GIL), is judged by what its kernel counts alone.
  void second_with_rank_1_silent(int at_second) {
    second([&](int rank, ProgressRecord& record) {
      record.completed = 4;
      if (rank == 0) record.pending = {call("barrier", 5, "0", {0, 1})};
      return rank == 0 || at_second < 2;
    });
  }
  std::optional<CollectiveStall> check() const { return watch_.check(now_); }
  CollectiveWatch& watch() { return watch_; }
  /// What the kernel on its node counts of `rank`'s process this second.
  void kernel(int rank, const ProcessActivity& activity) {
    watch_.observe_kernel(rank, 100 + rank, activity, now_);
  }
  /// Its CPU time alone, from a kernel that counts nothing of its threads.
  void kernel_cpu(int rank, double cpu_s) { kernel(rank, {.cpu_s = cpu_s}); }

 private:
  int world_;
  Clock::time_point now_ = Clock::now();
  CollectiveWatch watch_;
  std::vector<int64_t> numbers_;
  std::map<std::string, Clock::time_point> first_pending_;  ///< Rank and call -> first seen.
};

TEST(CollectiveWatch, UnevenShardsAreAMismatchNamedAfterTheCallMostRanksWaitIn) {
  Job job(3);
  for (int second = 0; second < 12; ++second) {
    job.second([&](int rank, ProgressRecord& record) {
      record.completed = 29;
      record.pending = {rank == 1 ? call("barrier", 30) : call("all_reduce", 30)};
      record.pending[0].pending_s = second;
      return true;
    });
    if (second < 9) {
      EXPECT_FALSE(job.check()) << "at " << second << " s";
    }
  }
  auto stall = job.check();
  ASSERT_TRUE(stall);
  EXPECT_EQ(describe(stall->collective), "all_reduce #30 on group 0 (gloo)");
  EXPECT_EQ(stall->in, (std::vector<int>{0, 2}));
  EXPECT_EQ(stall->missing, (std::vector<int>{1}));
  EXPECT_TRUE(stall->mismatch);
  EXPECT_EQ(stall->states.at(1).rfind("in barrier #30 on group 0 (gloo) for ", 0), 0u)
      << stall->states.at(1);
  EXPECT_NE(stall->states.at(1).find("a mismatch"), std::string::npos);
  EXPECT_GE(stall->collective.pending_s, 11);
}

// Each distinct call is compared once, not every pair of ranks; what a check costs is measured by
// hand, not timed here: ASan on a loaded box makes any bound either loose or flaky.
TEST(CollectiveWatch, UnevenShardsAmong16384RanksAreFoundInOneCheck) {
  constexpr int kWorld = 16384, kDone = 4096;  // Rank 4096 ran out of data: in user code.
  Job job(kWorld);
  for (int second = 0; second <= kTimeout; ++second)
    job.second([&](int rank, ProgressRecord& record) {
      record.completed = 29;
      if (rank != kDone) record.pending = {call("all_reduce", 30, "0", {})};
      return true;
    });
  auto stall = job.check();
  ASSERT_TRUE(stall);
  EXPECT_EQ(describe(stall->collective), "all_reduce #30 on group 0 (gloo)");
  EXPECT_EQ(stall->missing, (std::vector<int>{kDone}));
  EXPECT_EQ(stall->in.size(), size_t{kWorld - 1});
  EXPECT_EQ(stall->states.size(), size_t{kWorld});
}

TEST(CollectiveWatch, ARankBusyOutsideTheCollectiveIsProgress) {
  Job job(3);
  double cpu = 0;
  for (int second = 0; second < 3 * kTimeout; ++second) {
    job.second([&](int rank, ProgressRecord& record) {
      record.completed = 5;
      if (rank == 0)
        record.cpu_s = cpu += 0.9;  // Checkpointing: a busy core.
      else
        record.pending = {call("barrier", 6)};
      return true;
    });
    EXPECT_FALSE(job.check()) << "at " << second << " s";
  }
}

TEST(CollectiveWatch, AnIdleRankOutsideTheCollectiveIsNoProgress) {
  Job job(3);
  for (int second = 0; second < 12; ++second)
    job.second([&](int rank, ProgressRecord& record) {
      record.completed = 5;
      record.cpu_s = 1.0 + 0.001 * second;  // Blocked on a lock: the reporter's own crumbs.
      if (rank != 1) record.pending = {call("all_reduce", 6)};
      return true;
    });
  auto stall = job.check();
  ASSERT_TRUE(stall);
  EXPECT_EQ(stall->missing, (std::vector<int>{1}));
  EXPECT_FALSE(stall->mismatch);
  EXPECT_EQ(stall->states.at(1), "in user code: train.py:12 in step < train.py:40 in main");
}

TEST(CollectiveWatch, RanksOutsideAnyCollectiveAreNeverAStall) {
  Job job(2);
  for (int second = 0; second < 3 * kTimeout; ++second) {
    job.second([](int, ProgressRecord& record) {  // Sleeping in the data loader, or one long step.
      record.completed = 7;
      return true;
    });
    EXPECT_FALSE(job.check());
  }
}

TEST(CollectiveWatch, CompletedCollectivesAreProgress) {
  Job job(2);
  int64_t completed = 0;
  for (int second = 0; second < 3 * kTimeout; ++second) {
    ++completed;
    job.second([&](int, ProgressRecord& record) {
      record.completed = completed;
      record.pending = {call("all_reduce", completed + 1, "0", {0, 1})};  // Always one in flight.
      return true;
    });
    EXPECT_FALSE(job.check());
  }
}

TEST(CollectiveWatch, AnExitedRankIsMissingAndSaysHowItEnded) {
  Job job(3);
  for (int second = 0; second < 12; ++second)
    job.second([&](int rank, ProgressRecord& record) {
      record.completed = 9;
      record.pending = {call("all_reduce", 10)};
      return rank != 1;
    });
  job.watch().rank_ended(1, "exit code 0");
  auto stall = job.check();
  ASSERT_TRUE(stall);
  EXPECT_EQ(stall->missing, (std::vector<int>{1}));
  EXPECT_EQ(stall->states.at(1), "exited: exit code 0");
}

TEST(CollectiveWatch, AFailureReportShowsTheCallARankThatExitedWasIn) {
  // A process-group timeout: every rank times out, and which exits first is a race.
  Job job(3);
  for (int second = 0; second < 3; ++second)
    job.second([&](int rank, ProgressRecord& record) {
      record.pending = {rank == 1 ? call("barrier", 35) : call("all_reduce", 35)};
      return true;
    });
  job.watch().rank_ended(1, "exit code 1");
  const auto states = job.watch().ranks_in_collectives(Clock::now());
  EXPECT_EQ(states.at(1).rfind("exited: exit code 1; last in barrier #35 on group 0", 0), 0u)
      << states.at(1);
  EXPECT_EQ(states.at(0).rfind("in all_reduce #35 on group 0", 0), 0u) << states.at(0);
}

TEST(CollectiveWatch, ACallLeftForTeardownIsNoStallOnceTheRankSaysItIsExiting) {
  // Rank 2's last periodic record caught the final barrier; the others' came after it. Then
  // every interpreter exits, and torch's teardown outlasts the timeout with no record at all.
  for (bool says_exiting : {true, false}) {
    Job job(3);
    job.second([](int rank, ProgressRecord& record) {
      record.completed = rank == 2 ? 4 : 5;
      if (rank == 2) record.pending = {call("barrier", 5)};
      return true;
    });
    job.second([&](int rank, ProgressRecord& record) {
      record.completed = rank == 2 ? 4 : 5;
      if (rank == 2) record.pending = {call("barrier", 5)};
      record.exiting = says_exiting;
      return true;
    });
    for (int second = 0; second < 12; ++second)
      job.second([](int, ProgressRecord&) { return false; });
    EXPECT_EQ(job.check().has_value(),
              !says_exiting);  // Without the exiting record: a false stall.
  }
}

TEST(CollectiveWatch, AnExitingRankIsMissingFromTheCallTheOthersWaitIn) {
  Job job(3);
  for (int second = 0; second < 12; ++second)
    job.second([](int rank, ProgressRecord& record) {
      record.completed = 9;
      record.pending = {rank == 2 ? call("barrier", 10) : call("all_reduce", 10)};
      record.exiting = rank == 2;
      return true;
    });
  auto stall = job.check();
  ASSERT_TRUE(stall);
  EXPECT_EQ(stall->collective.op, "all_reduce");
  EXPECT_EQ(stall->missing, (std::vector<int>{2}));
  EXPECT_FALSE(stall->mismatch);  // It left every collective: nothing it waits in can match.
  EXPECT_EQ(stall->states.at(2).rfind(
                "exiting (its interpreter is shutting down); last in barrier #10", 0),
            0u)
      << stall->states.at(2);
  // A failure report shows the call the exiting rank left.
  EXPECT_EQ(job.watch().ranks_in_collectives(Clock::now()).at(2).rfind("in barrier #10", 0), 0u);
}

TEST(CollectiveWatch, EveryMemberInItAndItNeverCompletes) {
  Job job(2);
  for (int second = 0; second < 12; ++second)
    job.second([&](int, ProgressRecord& record) {
      record.completed = 0;
      record.cpu_s = second * 1.0;  // NCCL spinning inside the collective is no progress.
      record.pending = {call("all_reduce", 1, "0", {0, 1})};
      return true;
    });
  auto stall = job.check();
  ASSERT_TRUE(stall);
  EXPECT_TRUE(stall->missing.empty());
  EXPECT_EQ(stall->in, (std::vector<int>{0, 1}));
}

TEST(CollectiveWatch, ASubgroupNamesOnlyItsOwnMembersAsMissing) {
  Job job(3);
  for (int second = 0; second < 12; ++second)
    job.second([&](int rank, ProgressRecord& record) {
      record.completed = 3;
      if (rank == 0) record.pending = {call("barrier", 2, "1", {0, 1})};
      return true;
    });
  auto stall = job.check();
  ASSERT_TRUE(stall);
  EXPECT_EQ(stall->collective.group, "1");
  EXPECT_EQ(stall->in, (std::vector<int>{0}));
  EXPECT_EQ(stall->missing, (std::vector<int>{1}));
  EXPECT_TRUE(stall->states.contains(2));  // Still described, but nobody waits for it.
}

TEST(CollectiveWatch, TorchOneStacksMatchByOperation) {
  Job job(2);
  for (int second = 0; second < 12; ++second)
    job.second([&](int rank, ProgressRecord& record) {
      record.source = "stack";
      record.completed = -1;
      if (rank == 0)
        record.pending = {call("barrier", -1, "0", {0, 1})};
      else
        record.frames = {"uneven.py:20 in <module>", "torch/_tensor.py:487 in backward"};
      return true;
    });
  auto stall = job.check();
  ASSERT_TRUE(stall);
  EXPECT_EQ(describe(stall->collective), "barrier on group 0 (gloo)");
  EXPECT_EQ(stall->source, "stack");
  EXPECT_TRUE(stall->mismatch);  // DDP's all-reduce runs in backward(), unseen on torch 1.x.
  EXPECT_EQ(
      stall->states.at(1),
      "in backward(), where DDP's gradient all-reduce runs (torch 1.x cannot name it): likely "
      "a mismatch; torch/_tensor.py:487 in backward < uneven.py:20 in <module>");
}

TEST(CollectiveWatch, AReporterThatFellSilentIsSaidToBe) {
  Job job(2);
  for (int second = 0; second < 12; ++second)
    job.second([&](int rank, ProgressRecord& record) {
      record.completed = 4;
      if (rank == 0) record.pending = {call("all_reduce", 5, "0", {0, 1})};
      return rank == 0 || second < 2;
    });
  auto stall = job.check();
  ASSERT_TRUE(stall);
  EXPECT_NE(stall->states.at(1).find("its reporter cannot run"), std::string::npos);
}

TEST(CollectiveWatch, ARankBusyInACallThatHoldsTheGilIsProgressByItsKernelCpu) {
  // Rank 1 checkpoints in one long C call that never releases the GIL: its reporter cannot
  // write a record, but its node's kernel sees its core busy.
  Job job(2);
  double cpu = 0;
  for (int second = 0; second < 3 * kTimeout; ++second) {
    job.second_with_rank_1_silent(second);
    job.kernel_cpu(1, cpu += 0.9);
    EXPECT_FALSE(job.check()) << "at " << second << " s";
  }
}

TEST(CollectiveWatch, ASilentRankWhoseKernelCpuStandsStillIsAStall) {
  Job job(2);
  for (int second = 0; second < 12; ++second) {
    job.second_with_rank_1_silent(second);
    job.kernel_cpu(1, 3.0 + 0.001 * second);  // Blocked in C with the GIL held: no CPU.
  }
  auto stall = job.check();
  ASSERT_TRUE(stall);
  EXPECT_EQ(stall->missing, (std::vector<int>{1}));
}

TEST(CollectiveWatch, ARankBusyBeforeItsFirstRecordIsProgressByItsKernelCpu) {
  // Rank 0 prepares data in one GIL-holding call right after init: its reporter has sent
  // nothing yet, and rank 1 waits at the barrier. The common pattern; never a stall.
  Job job(2);
  double cpu = 0;
  for (int second = 0; second < 3 * kTimeout; ++second) {
    job.second([&](int rank, ProgressRecord& record) {
      record.pending = {call("barrier", 2, "0", {0, 1})};
      return rank == 1;
    });
    job.kernel_cpu(0, cpu += 0.9);
    EXPECT_FALSE(job.check()) << "at " << second << " s";
  }
}

TEST(CollectiveWatch, ARankWithNoRecordWhoseKernelCountsStandStillIsAStall) {
  // Rank 0 blocked on a lock before its reporter sent anything: no CPU, no wait, no I/O.
  Job job(2);
  for (int second = 0; second < 12; ++second) {
    job.second([&](int rank, ProgressRecord& record) {
      record.pending = {call("barrier", 2, "0", {0, 1})};
      return rank == 1;
    });
    job.kernel(0, {.cpu_s = 1 + 0.001 * second,
                   .main_run_s = 0.5,
                   .main_run_delay_s = 0.1,
                   .main_io_bytes = 4096});
  }
  auto stall = job.check();
  ASSERT_TRUE(stall);
  EXPECT_EQ(stall->missing, (std::vector<int>{0}));
  EXPECT_EQ(stall->states.at(0), "sent no progress record: no process group seen");
}

TEST(CollectiveWatch, ARankThatWaitsForACpuItIsNotGivenIsProgress) {
  // A box at load 8: rank 1 computes in a GIL-holding call but runs 2 % of each second and waits
  // for a CPU the rest; its kernel CPU alone is far under the busy share.
  Job job(2);
  ProcessActivity activity{.cpu_s = 1, .main_run_s = 1, .main_run_delay_s = 0, .main_io_bytes = 0};
  for (int second = 0; second < 3 * kTimeout; ++second) {
    job.second_with_rank_1_silent(second);
    activity.cpu_s += 0.02;
    activity.main_run_s += 0.02;
    activity.main_run_delay_s += 0.97;
    job.kernel(1, activity);
    EXPECT_FALSE(job.check()) << "at " << second << " s";
  }
}

TEST(CollectiveWatch, ARankWhoseMainThreadReadsOrWritesIsProgress) {
  // Rank 1 loads a checkpoint from a slow file system: little CPU, but its reads go on.
  Job job(2);
  ProcessActivity activity{.cpu_s = 1, .main_run_s = 1, .main_run_delay_s = 0, .main_io_bytes = 0};
  for (int second = 0; second < 3 * kTimeout; ++second) {
    job.second_with_rank_1_silent(second);
    activity.main_io_bytes += 1 << 20;
    job.kernel(1, activity);
    EXPECT_FALSE(job.check()) << "at " << second << " s";
  }
}

TEST(CollectiveWatch, KernelCountsOfARankInACollectiveAreNoProgress) {
  // Rank 1 spins in a collective (NCCL's busy wait) that rank 0 never joins: its CPU is no
  // evidence of anything but the wait.
  Job job(2);
  ProcessActivity activity{.cpu_s = 1, .main_run_s = 1, .main_run_delay_s = 0, .main_io_bytes = 0};
  for (int second = 0; second < 12; ++second) {
    job.second([&](int rank, ProgressRecord& record) {
      record.completed = 4;
      record.pending = {rank == 1 ? call("all_reduce", 5, "0", {0, 1})
                                  : call("barrier", 5, "0", {0, 1})};
      return true;
    });
    activity.cpu_s += 1;
    activity.main_run_s += 1;
    activity.main_io_bytes += 100;
    job.kernel(1, activity);
  }
  EXPECT_TRUE(job.check());
}

TEST(CollectiveWatch, ARecordsWaitForACpuIsProgressOutsideACollective) {
  // A remote rank on a loaded node: its reporter still writes, and its main thread got 3 % of a
  // core and waited for one the rest of each second.
  Job job(2);
  double cpu = 0, delay = 0;
  for (int second = 0; second < 3 * kTimeout; ++second) {
    job.second([&](int rank, ProgressRecord& record) {
      record.completed = 4;
      if (rank == 0) record.pending = {call("barrier", 5, "0", {0, 1})};
      record.cpu_s = rank == 1 ? (cpu += 0.03) : 0;
      record.run_delay_s = rank == 1 ? (delay += 0.95) : 0;
      return true;
    });
    EXPECT_FALSE(job.check()) << "at " << second << " s";
  }
}

TEST(CollectiveWatch, RanksInCollectivesSayWhereEachWasWithoutJudging) {
  Job job(2);
  job.second([](int rank, ProgressRecord& record) {
    if (rank == 0) record.pending = {call("all_reduce", 4, "0", {0, 1})};
    return true;
  });
  const auto states = job.watch().ranks_in_collectives(Clock::now() + seconds(1));
  ASSERT_EQ(states.size(), 2u);
  EXPECT_EQ(states.at(0).rfind("in all_reduce #4 on group 0 (gloo) for ", 0), 0u) << states.at(0);
  EXPECT_EQ(states.at(1).rfind("in user code: ", 0), 0u) << states.at(1);
  Job idle(2);
  idle.second([](int, ProgressRecord&) { return true; });
  EXPECT_TRUE(idle.watch().ranks_in_collectives(Clock::now()).empty());  // Nothing to say.
}

TEST(CollectiveWatch, ANewAttemptsProcessIsProgressNotAReplay) {
  CollectiveWatch watch(kTimeout, 1.0, Clock::now());
  ProgressRecord record;
  record.rank = 0;
  record.pid = 7;
  record.number = 5;
  record.pending = {call("all_reduce", 1, "0", {0})};
  const auto start = Clock::now();
  watch.observe(record, start);
  EXPECT_FALSE(watch.check(start + seconds(9)));
  record.number = 4;  // Replayed or late: ignored, so progress is still the first record.
  watch.observe(record, start + seconds(9));
  EXPECT_TRUE(watch.check(start + seconds(11)));
  record.pid = 8;  // A restarted worker's first record.
  record.number = 1;
  watch.observe(record, start + seconds(11));
  EXPECT_FALSE(watch.check(start + seconds(12)));
}

TEST(ProgressRecord, ParsesAReportersRecord) {
  auto record = parse_progress_record(
      R"({"v": 1, "rank": 2, "pid": 42, "n": 3, "source": "flight_recorder", "completed": 17,
          "pending": [{"group": "0", "group_ranks": [0, 1, 2], "op": "all_reduce", "seq": 18,
                       "backend": "gloo", "pending_s": 1.5}],
          "cpu_s": 12.25, "frames": ["a.py:1 in <module>"]})");
  ASSERT_TRUE(record) << record.error().message;
  EXPECT_EQ(record->rank, 2);
  EXPECT_EQ(record->completed, 17);
  ASSERT_EQ(record->pending.size(), 1u);
  EXPECT_EQ(record->pending[0].seq, 18);
  EXPECT_EQ(record->pending[0].group_ranks, (std::vector<int>{0, 1, 2}));
  EXPECT_DOUBLE_EQ(record->cpu_s, 12.25);
  EXPECT_FALSE(record->exiting);
  auto exiting = parse_progress_record(
      R"({"v": 1, "rank": 0, "pid": 42, "n": 4, "source": "stack", "completed": 0, "pending": [],
          "cpu_s": 0, "exiting": true})");
  ASSERT_TRUE(exiting) << exiting.error().message;
  EXPECT_TRUE(exiting->exiting);
}

TEST(ProgressRecord, RefusesWhatIsNotOne) {
  for (const char* text : {"", "[]", "{\"rank\": 1}", "not json",
                           R"({"rank": "x", "pid": 1, "n": 1, "source": "", "completed": 0,
                               "pending": [], "cpu_s": 0})",
                           R"({"rank": -3, "pid": 1, "n": 1, "source": "", "completed": 0,
                               "pending": [], "cpu_s": 0})",
                           R"({"rank": 1, "pid": 1, "n": 1, "source": "", "completed": 0,
                               "pending": [{"op": 5}], "cpu_s": 0})"}) {
    EXPECT_FALSE(parse_progress_record(text)) << text;
  }
}

TEST(CollectiveStall, RoundTripsThroughJson) {
  CollectiveStall stall;
  stall.collective = call("broadcast", 3);
  stall.collective.pending_s = 12.5;
  stall.in = {0, 2};
  stall.missing = {1};
  stall.states = {{0, "in broadcast"}, {1, "exited: exit code 0"}};
  stall.mismatch = true;
  stall.source = "flight_recorder";
  const CollectiveStall back = collective_stall_from_json(to_json(stall));
  EXPECT_EQ(describe(back.collective), "broadcast #3 on group 0 (gloo)");
  EXPECT_EQ(back.missing, stall.missing);
  EXPECT_EQ(back.states, stall.states);
  EXPECT_TRUE(back.mismatch);
}

/// A 16,384-rank uneven-shards stall: every rank but one in the all_reduce, rank 4096 idle.
CollectiveStall stall_of_16384_ranks() {
  CollectiveStall stall;
  stall.collective = call("all_reduce", 30, "0", {});
  stall.collective.pending_s = 11;
  for (int rank = 0; rank < 16384; ++rank) {
    (rank == 4096 ? stall.missing : stall.in).push_back(rank);
    stall.states[rank] = rank == 4096 ? "last in user code: train.py:52 in evaluate"
                                      : "in all_reduce #30 on group 0 (nccl)";
  }
  stall.source = "flight_recorder";
  return stall;
}

TEST(CollectiveStall, SixteenThousandRanksFitOneRendezvousFrameAsRanges) {
  const CollectiveStall stall = stall_of_16384_ranks();
  ASSERT_GT(to_json(stall).dump().size(), 64u * 1024);  // What used to be sent.
  const nlohmann::json compact = to_compact_json(stall, 60 * 1024);
  EXPECT_LT(compact.dump().size(), 1024u) << compact.dump();
  EXPECT_EQ(compact["in"], "0-4095,4097-16383");
  EXPECT_EQ(compact["missing"], "4096");
  EXPECT_FALSE(compact.contains("states_left_out"));
  const CollectiveStall back = collective_stall_from_json(compact);
  EXPECT_EQ(back.in, stall.in);
  EXPECT_EQ(back.missing, stall.missing);
  EXPECT_EQ(back.states, stall.states);
  EXPECT_EQ(describe(back.collective), "all_reduce #30 on group 0 (gloo)");
}

TEST(CollectiveStall, StatesThatDoNotFitAreLeftOutAndCounted) {
  CollectiveStall stall = stall_of_16384_ranks();
  // Every rank somewhere else, and every other rank missing: the worst case for ranges.
  stall.in.clear();
  stall.missing.clear();
  for (int rank = 0; rank < 16384; ++rank) {
    (rank % 2 ? stall.missing : stall.in).push_back(rank);
    stall.states[rank] = "in all_reduce, frame " + std::to_string(rank);
  }
  const size_t budget = 60 * 1024;
  const nlohmann::json compact = to_compact_json(stall, budget);
  EXPECT_LE(compact.dump().size(), budget);
  const size_t in_left_out = compact.value("in_left_out", size_t{0});
  const size_t missing_left_out = compact.value("missing_left_out", size_t{0});
  EXPECT_GT(in_left_out, 0u);
  EXPECT_GT(missing_left_out, 0u);
  const CollectiveStall back = collective_stall_from_json(compact);
  EXPECT_EQ(back.in.size() + in_left_out, 8192u);
  EXPECT_EQ(back.missing.size() + missing_left_out, 8192u);
  EXPECT_EQ(back.states.size() + compact.value("states_left_out", size_t{0}), 16384u);
  EXPECT_GT(back.states.size(), 0u);  // The budget's rest went to states, one group each.
}

TEST(CollectiveStall, AnEmptyListRoundTrips) {
  CollectiveStall stall;
  stall.collective = call("barrier", 1, "0", {});
  stall.in = {0, 1};
  stall.source = "stack";
  const CollectiveStall back = collective_stall_from_json(to_compact_json(stall, 60 * 1024));
  EXPECT_TRUE(back.missing.empty());
  EXPECT_TRUE(back.collective.group_ranks.empty());
  EXPECT_EQ(back.in, stall.in);
  EXPECT_THROW(collective_stall_from_json({{"group", "0"}, {"group_ranks", "1-"}}), std::exception);
}

}  // namespace
}  // namespace mcprun
