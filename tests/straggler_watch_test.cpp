#include "launcher/watch/straggler_watch.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

#include "launcher/watch/link_check.hpp"

namespace mcprun {
namespace {

using Clock = StragglerWatch::Clock;
constexpr int64_t kSecond = 1'000'000'000;

/// A job of `ranks` ranks on one host, one collective of `elements` per step, fed to the watch
/// one record per rank per second, as the reporters send them.
struct Job {
  int ranks = 3;
  double step_s = 1.0;
  int64_t elements = 65;
  int64_t bytes = int64_t{4} << 20;  ///< Of each collective, for its bus bandwidth.
  /// Which collectives the reporters send (past 64 a read, whole blocks of them).
  std::function<bool(int64_t seq)> kept = [](int64_t) { return true; };
  /// Per collective: from the last arrival to done, s.
  std::function<double(int64_t seq)> transfer_s = [](int64_t) { return 0.01; };
  StragglerSettings settings{.window_s = 20};
  StragglerWatch watch{settings};
  Clock::time_point now{};
  int64_t wall_ns = 1'700'000'000 * kSecond;
  int64_t seq = 0;
  int collectives_per_step = 1;  ///< Each at the step's start plus its delay(rank, seq).
  int record_number = 0;
  /// Per rank: its clock's offset from the store host's, ns.
  std::function<int64_t(int rank)> clock_offset = [](int) { return int64_t{0}; };
  /// Per rank and collective: how much later than the others it sees it complete, s.
  std::function<double(int rank, int64_t seq)> done_delay = [](int, int64_t) { return 0.0; };
  /// Per rank and step: how late it enqueues the step's collective, s.
  std::function<double(int rank, int64_t seq)> delay = [](int, int64_t) { return 0.0; };
  std::function<double(int rank)> run_delay_per_s = [](int) { return 0.0; };
  std::function<double(int rank)> cpu_per_s = [](int) { return 1.0; };
  /// Per rank: seconds a second in the data loader, as its reporter times it; null: untimed.
  std::function<double(int rank)> loader_per_s;
  /// Per rank: its cgroup's CPU quota in cores (0: none), and the share of periods throttled.
  std::function<std::pair<double, double>(int rank)> quota = [](int) {
    return std::pair{0.0, 0.0};
  };
  std::function<std::vector<std::string>(int rank)> frames = [](int) {
    return std::vector<std::string>{"train.py:40 in <module>", "train.py:12 in step"};
  };
  std::vector<std::string> lines;

  /// Runs `seconds` of the job; returns the lines the watch printed.
  void run(double seconds) {
    const int records = static_cast<int>(seconds);
    for (int second = 0; second < records; ++second) {
      ++record_number;
      std::map<int, ProgressRecord> records_now;
      for (int rank = 0; rank < ranks; ++rank) {
        ProgressRecord& record = records_now[rank];
        record.rank = rank;
        record.pid = 1000 + rank;
        record.number = record_number;
        record.host = "node-a";
        record.local_rank = rank;
        record.cpu_s = cpu_per_s(rank) * record_number;
        record.run_delay_s = run_delay_per_s(rank) * record_number;
        if (const auto [cores, throttled] = quota(rank); cores > 0) {
          record.cpu_quota_cores = cores;
          record.cpu_periods = 10 * record_number;  // 100 ms periods.
          record.cpu_throttled_periods = static_cast<int64_t>(throttled * 10 * record_number);
        }
        record.frames = frames(rank);
        if (loader_per_s) record.loader_s = loader_per_s(rank) * record_number;
        record.arrivals["0"].group_ranks.resize(static_cast<size_t>(ranks));
        for (int r = 0; r < ranks; ++r)
          record.arrivals["0"].group_ranks[static_cast<size_t>(r)] = r;
        record.arrivals["0"].step_s = step_s;  // As each rank's reporter finds it.
        record.arrivals["0"].period = collectives_per_step;
      }
      const int steps = std::max(1, static_cast<int>(1.0 / step_s));
      for (int step = 0; step < steps; ++step) {
        const int64_t start_ns = wall_ns + static_cast<int64_t>(step * step_s * kSecond);
        for (int collective = 0; collective < collectives_per_step; ++collective, ++seq) {
          double last_delay = 0;
          for (int rank = 0; rank < ranks; ++rank)
            last_delay = std::max(last_delay, delay(rank, seq));
          const int64_t done_ns =
              start_ns + static_cast<int64_t>((last_delay + transfer_s(seq)) * kSecond);
          for (int rank = 0; rank < ranks && kept(seq); ++rank) {
            GroupArrivals::Arrival arrival;
            arrival.seq = seq;
            arrival.created_ns =
                start_ns + static_cast<int64_t>(delay(rank, seq) * kSecond) + clock_offset(rank);
            arrival.elements = elements + collective;
            arrival.done_ns = done_ns + static_cast<int64_t>(done_delay(rank, seq) * kSecond) +
                              clock_offset(rank);
            arrival.bytes = bytes;
            arrival.op = "all_reduce";
            records_now[rank].arrivals["0"].arrivals.push_back(arrival);
          }
        }
      }
      wall_ns += kSecond;
      now += std::chrono::seconds(1);
      for (auto& [rank, record] : records_now) {
        record.sent_ns = wall_ns + clock_offset(rank);
        watch.observe(record, wall_ns + 200'000, now);  // 0.2 ms on the wire.
      }
      const std::chrono::system_clock::time_point wall{
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::nanoseconds(wall_ns))};
      // As the stall watch asks: the collectives first, then the ranks.
      const auto cpu_wait_share = [this](const std::vector<int>& ranks) {
        return watch.cpu_wait_share(ranks);
      };
      if (auto line = watch.bandwidth().check(now, wall, cpu_wait_share)) lines.push_back(*line);
      if (auto line = watch.check(now, wall)) lines.push_back(*line);
    }
  }
};

std::mt19937& noise() {
  static std::mt19937 generator(7);
  return generator;
}

TEST(StragglerWatch, ARankThatIsLateEveryStepIsNamedWithItsLagAndTheStep) {
  Job job;
  job.step_s = 0.5;
  job.delay = [](int rank, int64_t) { return rank == 2 ? 0.2 : 0.0; };
  job.cpu_per_s = [](int rank) { return rank == 2 ? 1.0 : 0.6; };  // The others wait for it.
  job.run(30);
  ASSERT_EQ(job.lines.size(), 1u);
  const std::string& line = job.lines[0];
  EXPECT_NE(line.find("straggler: rank 2 (node node-a, local rank 2) arrives last at 100% of the "
                      "steps on group 0, 200 ms behind the others"),
            std::string::npos)
      << line;
  EXPECT_NE(
      line.find(
          "; the others spent 40% of the last 20 s waiting for rank 2 (a step takes 500 ms); "),
      std::string::npos)
      << line;
  EXPECT_NEAR(job.watch.episodes()[0].cost_share, 0.4, 0.01);
  EXPECT_NEAR(job.watch.episodes()[0].wait_share, 1.0, 0.01);
  EXPECT_NE(line.find("in its own compute"), std::string::npos) << line;
  ASSERT_EQ(job.watch.episodes().size(), 1u);
  EXPECT_EQ(job.watch.episodes()[0].rank, 2);
  EXPECT_NEAR(job.watch.episodes()[0].median_lag_s, 0.2, 0.001);
}

TEST(StragglerWatch, ARankLateAtTheFirstOfEachStepsCollectivesIsNamed) {
  // Four collectives a step (DDP's buckets and the loop's own): the slow rank holds the others
  // back at the first only; past it, every rank is in step and any may be last.
  Job job;
  job.step_s = 0.25;
  std::uniform_real_distribution<double> jitter(0, 0.001);
  job.delay = [&](int rank, int64_t seq) {
    const int64_t in_step = seq % 4;
    if (in_step == 0) return rank == 1 ? 0.06 : jitter(noise());
    return 0.06 + 0.005 * static_cast<double>(in_step) + jitter(noise());
  };
  job.collectives_per_step = 4;
  job.run(40);
  ASSERT_FALSE(job.lines.empty());
  EXPECT_NE(job.lines[0].find(
                "straggler: rank 1 (node node-a, local rank 1) arrives last at 100% of the steps"),
            std::string::npos)
      << job.lines[0];
}

TEST(StragglerWatch, TheRecentCollectivesOfAManyRankJobKeepThePicturesRowsAndTheLastArrival) {
  Job job;
  job.ranks = 100;
  job.delay = [](int rank, int64_t) { return rank == 90 ? 0.2 : 0.0; };
  job.run(5);
  ASSERT_FALSE(job.watch.recent().empty());
  const auto& arrivals = job.watch.recent().back().arrivals;
  EXPECT_EQ(arrivals.size(), kMaxPictureRows + 1);
  EXPECT_TRUE(
      std::any_of(arrivals.begin(), arrivals.end(), [](const auto& a) { return a.first == 90; }));
}

TEST(StragglerWatch, ARankWithMoreWorkLateByLessThanTheFloorAtMostStepsIsNamed) {
  // Rank 1 works on a larger batch: 8-14 ms late at each 30 ms step, so its lag clears the
  // 10 ms floor at a third of the steps only, and costs the others a third of their time.
  Job job;
  job.step_s = 0.03;
  std::uniform_real_distribution<double> jitter(0, 0.002), its_lag(0.008, 0.014);
  job.delay = [&](int rank, int64_t) { return rank == 1 ? its_lag(noise()) : jitter(noise()); };
  job.run(40);
  ASSERT_FALSE(job.lines.empty());
  EXPECT_NE(job.lines[0].find("straggler: rank 1 "), std::string::npos) << job.lines[0];
  EXPECT_GT(job.watch.episodes()[0].cost_share, 0.25);
  EXPECT_GT(job.watch.episodes()[0].wait_share, 0.9);
}

TEST(StragglerWatch, ARankFrozenForMostOfEveryThirdStepIsNamed) {
  // A CPU quota's throttling: the rank's cgroup is frozen for the rest of each 100 ms period,
  // so it is very late at one step in three and on time at the others.
  Job job;
  job.step_s = 0.03;
  std::uniform_real_distribution<double> jitter(0, 0.002);
  job.delay = [&](int rank, int64_t seq) {
    return jitter(noise()) + (rank == 2 && seq % 3 == 2 ? 0.07 : 0);
  };
  job.run(40);
  ASSERT_FALSE(job.lines.empty());
  EXPECT_NE(job.lines[0].find("straggler: rank 2 "), std::string::npos) << job.lines[0];
  EXPECT_NE(job.lines[0].find("arrives last at 33% of the steps"), std::string::npos)
      << job.lines[0];
}

TEST(StragglerWatch, AThrottledCgroupIsTheCauseWithItsQuota) {
  Job job;
  job.step_s = 0.03;
  job.delay = [&](int rank, int64_t seq) { return rank == 2 && seq % 3 == 2 ? 0.07 : 0.0; };
  job.quota = [](int rank) { return rank == 2 ? std::pair{0.3, 0.71} : std::pair{0.0, 0.0}; };
  job.cpu_per_s = [](int rank) { return rank == 2 ? 0.3 : 1.0; };
  job.run(40);
  ASSERT_FALSE(job.lines.empty());
  EXPECT_NE(job.lines[0].find(
                "; throttled by its cgroup's CPU quota (30% of a core): throttled in 71% of "
                "its periods"),
            std::string::npos)
      << job.lines[0];
}

TEST(StragglerWatch, ARankThatStallsEveryTenthStepIsNamed) {
  Job job;
  job.step_s = 0.05;
  std::uniform_real_distribution<double> jitter(0, 0.002);
  job.delay = [&](int rank, int64_t seq) {
    return jitter(noise()) + (rank == 0 && seq % 10 == 9 ? 0.3 : 0);
  };
  job.run(40);
  ASSERT_FALSE(job.lines.empty());
  EXPECT_NE(job.lines[0].find("straggler: rank 0 "), std::string::npos) << job.lines[0];
}

TEST(StragglerWatch, ARankLateBecauseItsLinkFinishesEachCollectiveLastIsNoStraggler) {
  // Rank 0's link is slow: it sees each all-reduce complete 500 ms after the others, so it
  // arrives 500 ms late at the next, after its own work, which takes as long as theirs.
  Job job;
  job.step_s = 1;
  job.delay = [](int rank, int64_t) { return rank == 0 ? 0.5 : 0.0; };
  job.done_delay = [](int rank, int64_t) { return rank == 0 ? 0.5 : 0.0; };
  job.run(60);
  EXPECT_TRUE(job.watch.episodes().empty()) << job.lines.front();
  // The same lag from its own work, the completions alike: a straggler.
  Job compute;
  compute.step_s = 1;
  compute.delay = [](int rank, int64_t) { return rank == 0 ? 0.5 : 0.0; };
  compute.run(60);
  ASSERT_FALSE(compute.lines.empty());
  EXPECT_NE(compute.lines[0].find("straggler: rank 0 "), std::string::npos) << compute.lines[0];
}

TEST(StragglerWatch, ARankItsQuotaFreezesInsideItsCollectivesIsNamedForItsQuota) {
  // Rank 0's quota freezes it inside collectives as well as between them: it sees each complete
  // last and arrives late at the next, as a rank behind a slow link does, but the cause is its own.
  Job job;
  job.step_s = 1;
  job.delay = [](int rank, int64_t) { return rank == 0 ? 0.5 : 0.0; };
  job.done_delay = [](int rank, int64_t) { return rank == 0 ? 0.5 : 0.0; };
  job.quota = [](int rank) { return rank == 0 ? std::pair{0.15, 0.8} : std::pair{0.0, 0.0}; };
  job.cpu_per_s = [](int rank) { return rank == 0 ? 0.15 : 1.0; };
  job.run(60);
  ASSERT_FALSE(job.lines.empty());
  EXPECT_NE(job.lines[0].find("straggler: rank 0 "), std::string::npos) << job.lines[0];
  EXPECT_NE(job.lines[0].find("; throttled by its cgroup's CPU quota (15% of a core)"),
            std::string::npos)
      << job.lines[0];
}

TEST(StragglerWatch, ALateRankWithNoCauseOfItsOwnWhileItsCollectivesCrawlIsTheCollectivesCase) {
  // A link cut mid-job: from collective 30 each all-reduce takes 500 ms and ends later on rank 0,
  // which arrives 400 ms late at the next; its CPU is the others'. The reporters time a quarter
  // of the collectives only, so the completions that would say so are mostly unknown.
  Job job;
  job.transfer_s = [](int64_t seq) { return seq < 30 ? 0.01 : 0.5; };
  job.delay = [](int rank, int64_t seq) { return rank == 0 && seq > 30 ? 0.4 : 0.0; };
  job.done_delay = [](int, int64_t seq) { return seq % 4 ? -1e4 : 0.0; };  // Untimed: no done.
  job.run(60);
  ASSERT_FALSE(job.watch.bandwidth().episodes().empty());
  EXPECT_TRUE(job.watch.episodes().empty()) << job.lines.back();
  // The same lateness while the collectives run at their pace: named, not as compute.
  Job waits;
  waits.delay = [](int rank, int64_t) { return rank == 0 ? 0.4 : 0.0; };
  waits.run(60);
  ASSERT_FALSE(waits.lines.empty());
  EXPECT_NE(waits.lines[0].find("straggler: rank 0 "), std::string::npos) << waits.lines[0];
  EXPECT_NE(
      waits.lines[0].find("; not in CPU work of its own (it used 100% of a CPU, the others 100%): "
                          "a wait between its collectives"),
      std::string::npos)
      << waits.lines[0];
}

TEST(StragglerWatch, ALittleMoreCpuThanTheOthersIsNoComputeCauseForALargeLag) {
  // Rank 0 is 200 ms late at every 500 ms step, and uses 13 % of a CPU to the others' 10 %:
  // 15 ms more a step, which cannot be where 200 ms go (a rank behind a slow link waits).
  Job job;
  job.step_s = 0.5;
  job.delay = [](int rank, int64_t) { return rank == 0 ? 0.2 : 0.0; };
  job.cpu_per_s = [](int rank) { return rank == 0 ? 0.13 : 0.1; };
  job.run(30);
  ASSERT_FALSE(job.lines.empty());
  EXPECT_NE(job.lines[0].find("; not in CPU work of its own (it used 13% of a CPU, the others "
                              "10%, 15 ms more a step against 200 ms of lateness a step): a wait "
                              "between its collectives"),
            std::string::npos)
      << job.lines[0];
  // Beside a CPU hog: 17 % of a CPU more at a 66 ms step is 11 ms, for 19 ms of lateness, and
  // it waited for a CPU 20 % of the time (the others 15 %), which stretches those 11 ms to 17 of
  // wall clock: its own compute.
  Job hogged;
  hogged.step_s = 0.064;
  std::uniform_real_distribution<double> jitter(0, 0.002);
  hogged.delay = [&](int rank, int64_t) { return rank == 1 ? 0.019 : jitter(noise()); };
  hogged.cpu_per_s = [](int rank) { return rank == 1 ? 0.41 : 0.24; };
  hogged.run_delay_per_s = [](int rank) { return rank == 1 ? 0.2 : 0.15; };
  hogged.run(30);
  ASSERT_FALSE(hogged.lines.empty());
  EXPECT_NE(hogged.lines[0].find("; in its own compute: it used 41% of a CPU, the others 24%"),
            std::string::npos)
      << hogged.lines[0];
  // The same lag where its CPU beyond theirs accounts for it: its own compute.
  Job compute;
  compute.step_s = 0.5;
  compute.delay = [](int rank, int64_t) { return rank == 0 ? 0.2 : 0.0; };
  compute.cpu_per_s = [](int rank) { return rank == 0 ? 0.5 : 0.1; };
  compute.run(30);
  ASSERT_FALSE(compute.lines.empty());
  EXPECT_NE(compute.lines[0].find("; in its own compute: it used 50% of a CPU, the others 10%"),
            std::string::npos)
      << compute.lines[0];
}

TEST(StragglerWatch, ALagThatRotatesFromRankToRankNamesNobody) {
  Job job;
  job.step_s = 0.05;
  std::uniform_real_distribution<double> jitter(0, 0.002);
  job.delay = [&](int rank, int64_t seq) {
    return jitter(noise()) + (rank == (seq / 10) % 3 ? 0.02 : 0);
  };
  job.run(120);
  EXPECT_TRUE(job.lines.empty()) << job.lines.front();
}

TEST(StragglerWatch, ABalancedJobWithNoiseNamesNobody) {
  Job job;
  job.step_s = 0.25;
  std::uniform_real_distribution<double> jitter(0, 0.05);
  job.delay = [&](int, int64_t) { return jitter(noise()); };
  job.run(120);
  EXPECT_TRUE(job.lines.empty()) << job.lines.front();
}

TEST(StragglerWatch, Rank0EvaluatingNowAndThenIsNoStraggler) {
  Job job;
  job.step_s = 0.1;
  std::uniform_real_distribution<double> jitter(0, 0.01);
  job.delay = [&](int rank, int64_t seq) {
    return jitter(noise()) + (rank == 0 && seq % 50 == 49 ? 2.0 : 0);
  };
  job.run(120);
  EXPECT_TRUE(job.lines.empty()) << job.lines.front();
}

TEST(StragglerWatch, JitterOnAShortStepNamesNobody) {
  Job job;
  job.step_s = 0.015;  // Steps under 20 ms, one rank always 2 ms late.
  job.delay = [](int rank, int64_t) { return rank == 1 ? 0.002 : 0.0; };
  job.run(60);
  EXPECT_TRUE(job.lines.empty()) << job.lines.front();
}

TEST(StragglerWatch, AnotherNodesClockOffsetIsRemoved) {
  Job job;
  job.step_s = 0.5;
  // Rank 2's node runs 3 s ahead: unremoved, rank 2 would look last every time.
  job.clock_offset = [](int rank) { return rank == 2 ? 3 * kSecond : int64_t{0}; };
  job.delay = [](int rank, int64_t) { return rank == 1 ? 0.1 : 0.0; };
  job.run(30);
  ASSERT_EQ(job.lines.size(), 1u);
  EXPECT_NE(job.lines[0].find("straggler: rank 1 "), std::string::npos) << job.lines[0];
  EXPECT_NE(job.lines[0].find("100 ms behind"), std::string::npos) << job.lines[0];
}

TEST(StragglerWatch, TheCauseIsTheDataLoaderOrStarvationWhereTheRecordsShowIt) {
  Job loader;
  loader.delay = [](int rank, int64_t) { return rank == 1 ? 0.3 : 0.0; };
  loader.frames = [](int rank) {
    return rank == 1 ? std::vector<std::string>{"train.py:30 in <module>",
                                                "dataloader.py:633 in __next__",
                                                "fetch.py:51 in fetch", "train.py:9 in __getitem__"}
                     : std::vector<std::string>{"train.py:33 in <module>"};
  };
  loader.run(30);
  ASSERT_EQ(loader.lines.size(), 1u);
  EXPECT_NE(loader.lines[0].find("in its data loader: 100% of its time was in torch's "
                                 "DataLoader, the others' 0%"),
            std::string::npos)
      << loader.lines[0];

  // Timed by the reporter's loader clock, whatever its sampled stacks caught: on a loaded box
  // they land beside the loader's waits less often than those waits last.
  Job timed;
  timed.delay = [](int rank, int64_t) { return rank == 1 ? 0.3 : 0.0; };
  timed.loader_per_s = [](int rank) { return rank == 1 ? 0.6 : 0.02; };
  timed.run(30);
  ASSERT_EQ(timed.lines.size(), 1u);
  EXPECT_NE(timed.lines[0].find("in its data loader: 60% of its time was in torch's DataLoader, "
                                "the others' 2%"),
            std::string::npos)
      << timed.lines[0];
  Job loads_alike;  // Every rank loads alike: its lateness does not go there.
  loads_alike.delay = [](int rank, int64_t) { return rank == 1 ? 0.3 : 0.0; };
  loads_alike.loader_per_s = [](int) { return 0.3; };
  loads_alike.run(30);
  ASSERT_EQ(loads_alike.lines.size(), 1u);
  EXPECT_EQ(loads_alike.lines[0].find("in its data loader"), std::string::npos)
      << loads_alike.lines[0];

  Job starved;
  starved.delay = [](int rank, int64_t) { return rank == 0 ? 0.3 : 0.0; };
  starved.run_delay_per_s = [](int rank) { return rank == 0 ? 0.5 : 0.01; };
  starved.cpu_per_s = [](int rank) { return rank == 0 ? 0.5 : 1.0; };
  starved.run(30);
  ASSERT_EQ(starved.lines.size(), 1u);
  EXPECT_NE(
      starved.lines[0].find("starved of CPU: it waited for a CPU 50% of the time, the others 1%"),
      std::string::npos)
      << starved.lines[0];
}

TEST(StragglerWatch, OneLineAWindowAndOneWhenTheStragglerIsGone) {
  Job job;
  job.step_s = 0.5;
  job.delay = [](int rank, int64_t seq) { return rank == 2 && seq < 80 ? 0.2 : 0.0; };
  job.run(40);  // Named, then on time from step 80 (40 s).
  ASSERT_EQ(job.lines.size(), 1u);
  job.run(60);
  ASSERT_EQ(job.lines.size(), 2u);
  EXPECT_NE(job.lines[1].find("straggler gone: rank 2 no longer holds the others back"),
            std::string::npos)
      << job.lines[1];
  job.run(60);
  EXPECT_EQ(job.lines.size(), 2u);
}

TEST(StragglerWatch, AnotherRankTakingOverEndsOneAndNamesTheOther) {
  Job job;
  job.step_s = 0.5;
  job.delay = [](int rank, int64_t seq) { return rank == (seq < 60 ? 2 : 0) ? 0.2 : 0.0; };
  job.run(90);
  // While the window holds both, neither is last at 75%: the first is gone before the next.
  ASSERT_EQ(job.lines.size(), 3u);
  EXPECT_NE(job.lines[0].find("straggler: rank 2 "), std::string::npos) << job.lines[0];
  EXPECT_NE(job.lines[1].find("straggler gone: rank 2 "), std::string::npos) << job.lines[1];
  EXPECT_NE(job.lines[2].find("straggler: rank 0 "), std::string::npos) << job.lines[2];
  EXPECT_EQ(job.watch.episodes().size(), 2u);
}

TEST(StragglerWatch, ALagThatDoublesIsOneMoreLine) {
  Job job;
  job.step_s = 1;
  job.delay = [](int rank, int64_t seq) { return rank == 1 ? (seq < 30 ? 0.1 : 0.3) : 0.0; };
  job.run(80);
  ASSERT_EQ(job.lines.size(), 2u);
  EXPECT_NE(job.lines[1].find("straggler now: rank 1 "), std::string::npos) << job.lines[1];
  EXPECT_NE(job.lines[1].find("300 ms behind"), std::string::npos) << job.lines[1];
}

TEST(StragglerWatch, ARankIsNamedFromThinnedArrivalsByTheStepsTheyHold) {
  // 80 collectives a second: the reporters send every other block of 64, so the window spans
  // twice the steps its samples hold.
  Job job;
  job.step_s = 0.05;
  job.collectives_per_step = 4;
  job.kept = [](int64_t seq) { return (seq / 64) % 2 == 0; };
  job.delay = [](int rank, int64_t seq) { return seq % 4 == 0 && rank == 2 ? 0.02 : 0.0; };
  job.run(40);
  ASSERT_FALSE(job.lines.empty());
  EXPECT_NE(job.lines[0].find(
                "straggler: rank 2 (node node-a, local rank 2) arrives last at 100% of the steps"),
            std::string::npos)
      << job.lines[0];
}

TEST(BandwidthWatch, BusFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor("all_reduce", 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor("_allgather_base", 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor("reduce_scatter_tensor_coalesced", 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor("all_to_all", 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor("broadcast", 4), 1);
  EXPECT_DOUBLE_EQ(bus_factor("reduce", 4), 1);
  EXPECT_DOUBLE_EQ(bus_factor("barrier", 4), 0);
  EXPECT_DOUBLE_EQ(bus_factor("all_reduce", 1), 0);
  EXPECT_EQ(size_bucket(1000), -1);
  EXPECT_EQ(size_bucket_label(size_bucket(int64_t{4} << 20)), "4 MiB-16 MiB");
  EXPECT_EQ(size_bucket_label(size_bucket(int64_t{100} << 10)), "64 KiB-256 KiB");
}

TEST(BandwidthWatch, AnAllReduceThatSlowsDownIsNamedWithItsBandwidthBeforeAndNow) {
  Job job;
  job.transfer_s = [](int64_t seq) { return seq < 30 ? 0.01 : 0.5; };
  job.run(60);
  ASSERT_EQ(job.lines.size(), 1u) << job.lines[0];
  const std::string& line = job.lines[0];
  // 4 MiB among 3 ranks, 2(n-1)/n: 5.59 MB a collective, in 10 ms then 500 ms; named as soon as
  // the window's slow ones outweigh its fast ones.
  EXPECT_NE(
      line.find("slow collective: all_reduce of 4 MiB-16 MiB on group 0 (ranks 0-2) runs at 0.0"),
      std::string::npos)
      << line;
  EXPECT_NE(
      line.find("GB/s bus bandwidth, under 50% of the 0.559 GB/s it ran at earlier in this job; "
                "one takes "),
      std::string::npos)
      << line;
  EXPECT_LT(job.watch.bandwidth().episodes()[0].busbw_now, 0.5 * 0.559e9);
  EXPECT_GT(job.watch.bandwidth().episodes()[0].busbw_now, 5.59e6 / 0.5);
  ASSERT_EQ(job.watch.bandwidth().episodes().size(), 1u);
  EXPECT_EQ(job.watch.bandwidth().episodes()[0].ranks, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(job.watch.episodes().empty()) << "a slow link names no straggler";
}

TEST(BandwidthWatch, ALinkThatSlowsBeforeHalfAWindowIsJudgedAgainstWhatCameBefore) {
  // The default minute's window, a link cut 25 s in, a quarter of the collectives timed: the
  // figures before the cut are the baseline, and the windows that mix both are none.
  Job job;
  job.settings.window_s = 60;
  job.watch = StragglerWatch(job.settings);
  job.transfer_s = [](int64_t seq) { return seq < 25 ? 0.01 : 0.5; };
  job.done_delay = [](int, int64_t seq) { return seq % 4 ? -1e4 : 0.0; };  // Untimed: no done.
  job.run(120);
  ASSERT_FALSE(job.watch.bandwidth().episodes().empty());
  EXPECT_NEAR(job.watch.bandwidth().episodes()[0].busbw_before, 0.559e9, 0.01e9);
  EXPECT_TRUE(job.watch.bandwidth().runs_slow("0", 1));
  EXPECT_FALSE(job.watch.bandwidth().runs_slow("1", 1));
}

TEST(BandwidthWatch, ACollectiveSlowedByALoadedBoxIsNoSlowLink) {
  // Halfway, other work takes the CPU: every rank's main thread waits for one 60 % of the time,
  // and gloo's reductions, which run on the CPU, slow down with it.
  Job job;
  job.run(30);
  job.transfer_s = [](int64_t) { return 0.5; };
  job.run_delay_per_s = [](int) { return 0.6; };
  job.run(60);
  EXPECT_TRUE(job.lines.empty()) << job.lines[0];
}

TEST(BandwidthWatch, ItsEndIsSaidOnce) {
  Job job;
  job.transfer_s = [](int64_t seq) { return seq >= 30 && seq < 60 ? 0.5 : 0.01; };
  job.run(120);
  ASSERT_EQ(job.lines.size(), 2u);
  EXPECT_EQ(job.lines[1],
            "slow collective gone: all_reduce of 4 MiB-16 MiB on group 0 runs at over 50% of its "
            "earlier bandwidth again");
}

TEST(BandwidthWatch, CollectivesThatStopAreNotSaidToBeFastAgain) {
  // Slow from the 30th; past the 70th the job runs none (its last steps, or a stall).
  Job job;
  job.transfer_s = [](int64_t seq) { return seq < 30 ? 0.01 : 0.5; };
  job.kept = [](int64_t seq) { return seq < 70; };
  job.run(120);
  ASSERT_EQ(job.lines.size(), 1u) << job.lines.back();
  EXPECT_NE(job.lines[0].find("slow collective: all_reduce"), std::string::npos) << job.lines[0];
}

TEST(BandwidthWatch, ARankThatArrivesLateMakesNoCollectiveSlow) {
  // Its peers wait for it in the collective; the transfer itself takes as long as ever.
  Job job;
  job.delay = [](int rank, int64_t seq) { return rank == 1 && seq >= 20 ? 0.4 : 0.0; };
  job.run(60);
  for (const std::string& line : job.lines)
    EXPECT_EQ(line.find("slow collective"), std::string::npos) << line;
  EXPECT_TRUE(job.watch.bandwidth().episodes().empty());
}

TEST(BandwidthWatch, AFastCollectivesJitterNamesNothing) {
  // Five times slower, but 5 ms a collective: under --slow-collective-min-time.
  Job job;
  job.transfer_s = [](int64_t seq) { return seq < 30 ? 0.001 : 0.005; };
  job.run(60);
  EXPECT_TRUE(job.lines.empty()) << job.lines[0];
}

TEST(BandwidthWatch, UnderPreflightsFloorFromTheStartIsSlow) {
  Job job;
  job.watch.bandwidth().set_floor(int64_t{1} << 20, 2e9);
  job.transfer_s = [](int64_t) { return 0.2; };
  job.run(30);
  ASSERT_EQ(job.lines.size(), 1u);
  EXPECT_NE(job.lines[0].find("under 50% of the 2 GB/s that --preflight measured"),
            std::string::npos)
      << job.lines[0];
  EXPECT_TRUE(job.watch.bandwidth().episodes()[0].before_is_preflight);
}

TEST(BandwidthWatch, SmallCollectivesAndUnknownOpsAreNotTimed) {
  Job job;
  job.bytes = 4096;
  job.run(10);
  EXPECT_TRUE(job.watch.bandwidth().figures().empty());
}

TEST(LinkSamples, TheConnectionWhoseSendQueueStaysFullIsTheSlowLink) {
  LinkSamples samples;
  for (int i = 0; i < kLinkSamples; ++i) {
    samples.add(2,
                {{{"10.0.0.3", 50000}, {"10.0.0.1", 41000}, 3u << 20},
                 {{"10.0.0.3", 50001}, {"10.0.0.2", 42000}, 1000},
                 {{"10.0.0.3", 50002}, {"10.0.0.1", 29500}, 8u << 20}},  // The job store's.
                29500);
  }
  EXPECT_EQ(
      samples.verdict("c", kLinkSamples),
      "slow link: rank 2 (node c) sends to 10.0.0.1:41000 slowly: its connection's send queue "
      "held 3 MiB on average over 2 s, data that the link had not carried yet");
}

TEST(LinkSamples, QueuesThatDrainNameNoLink) {
  LinkSamples samples;
  samples.add(0, {{{"10.0.0.1", 50000}, {"10.0.0.2", 41000}, 1u << 20}},
              29500);  // One full sample,
  for (int i = 1; i < kLinkSamples; ++i)
    samples.add(0, {{{"10.0.0.1", 50000}, {"10.0.0.2", 41000}, 0}}, 29500);
  EXPECT_EQ(samples.verdict("a", kLinkSamples),
            std::nullopt);  // ...then empty: a burst, not a slow link.
}

}  // namespace
}  // namespace mcprun
