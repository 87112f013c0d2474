// What the straggler and bandwidth watches cost the node that serves the job store, at N ranks:
// every rank's record once a second, with its arrivals every fourth record (64 collectives at
// most, as the reporters send them), one rank 20 ms late at each step; fed through the watches
// as the stall watch feeds them. Prints one JSON line: the CPU the watches took per second of
// job, and their slowest second.
//
//   straggler_judge [--ranks 64] [--seconds 120] [--step-ms 100]

#include <time.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "launcher/watch/straggler_watch.hpp"

namespace {

double cpu_seconds() {
  timespec now{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) / 1e9;
}

int flag(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mcprun;
  const int ranks = flag(argc, argv, "--ranks", 64);
  const int seconds = flag(argc, argv, "--seconds", 120);
  const int step_ms = flag(argc, argv, "--step-ms", 100);
  constexpr int kArrivalsEvery = 4, kLateRank = 1;
  // As the reporters send them (worker_helper/mcprun/_progress.py): all in a job of up to 64.
  const size_t max_arrivals = ranks <= 64 ? 256 : 64;
  constexpr int64_t kSecond = 1'000'000'000;

  StragglerSettings settings;
  StragglerWatch watch(settings);
  StragglerWatch::Clock::time_point now{};
  int64_t wall_ns = 1'700'000'000 * kSecond;
  int64_t seq = 0;
  std::vector<GroupArrivals::Arrival> sent;  // Since the last record that carried arrivals.
  double cpu_total_s = 0, slowest_s = 0;
  size_t lines = 0;
  for (int second = 1; second <= seconds; ++second) {
    for (int64_t start_ns = wall_ns; start_ns < wall_ns + kSecond;
         start_ns += step_ms * 1'000'000LL, ++seq) {
      GroupArrivals::Arrival arrival;
      arrival.seq = seq;
      arrival.created_ns = start_ns;
      arrival.done_ns = start_ns + 25'000'000;
      arrival.bytes = int64_t{4} << 20;
      arrival.elements = arrival.bytes / 4;
      arrival.op = "all_reduce";
      sent.push_back(arrival);
    }
    wall_ns += kSecond;
    now += std::chrono::seconds(1);
    const bool with_arrivals = second % kArrivalsEvery == 0;
    if (with_arrivals && sent.size() > max_arrivals)
      sent.erase(sent.begin(), sent.end() - static_cast<std::ptrdiff_t>(max_arrivals));
    std::vector<ProgressRecord> records(static_cast<size_t>(ranks));
    for (int rank = 0; rank < ranks; ++rank) {
      ProgressRecord& record = records[static_cast<size_t>(rank)];
      record.rank = rank;
      record.pid = 1000 + rank;
      record.number = second;
      record.host = "node-" + std::to_string(rank / 8);
      record.local_rank = rank % 8;
      record.cpu_s = 0.6 * second;
      record.sent_ns = wall_ns;
      record.frames = {"train.py:40 in <module>", "train.py:12 in step"};
      if (!with_arrivals) continue;
      GroupArrivals& group = record.arrivals["0"];
      if (ranks <= 64)
        for (int member = 0; member < ranks; ++member) group.group_ranks.push_back(member);
      group.step_s = step_ms / 1000.0;
      group.period = 1;
      group.arrivals = sent;
      for (GroupArrivals::Arrival& arrival : group.arrivals)
        if (rank == kLateRank) arrival.created_ns += 20'000'000;
    }
    if (with_arrivals) sent.clear();
    const std::chrono::system_clock::time_point wall{
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::nanoseconds(wall_ns))};
    const double before = cpu_seconds();
    for (const ProgressRecord& record : records) watch.observe(record, wall_ns + 200'000, now);
    if (watch.bandwidth().check(now, wall)) ++lines;
    if (watch.check(now, wall)) ++lines;
    const double took = cpu_seconds() - before;
    cpu_total_s += took;
    slowest_s = std::max(slowest_s, took);
  }
  std::printf(
      "{\"ranks\": %d, \"seconds\": %d, \"step_ms\": %d, \"cpu_ms_per_s\": %.3f, "
      "\"slowest_second_ms\": %.3f, \"lines\": %zu, \"straggler_named\": %s}\n",
      ranks, seconds, step_ms, 1000 * cpu_total_s / seconds, 1000 * slowest_s, lines,
      watch.episodes().empty() ? "false" : "true");
  return 0;
}
