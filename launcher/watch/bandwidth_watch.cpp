#include "launcher/watch/bandwidth_watch.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "common/sys.hpp"
#include "common/topology.hpp"

namespace mcprun {
namespace {

// Fewer timed collectives than this in a window are no figure of a kind's bandwidth (a quarter
// of them are timed).
constexpr size_t kMinTimedCollectives = 5;
// Checks whose figures make the earlier bandwidth: ten minutes of them.
constexpr size_t kHealthyFigures = 600;
// The smallest size whose bandwidth says something of a link: below it, latency rules.
constexpr int64_t kSmallestBucketBytes = int64_t{64} << 10;

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

bool is_all_reduce(const std::string& op) {
  return contains(op, "all_reduce") || contains(op, "allreduce");
}

std::string gbps(double bytes_per_s) { return fmt::format("{:.3g} GB/s", bytes_per_s / 1e9); }

int64_t bucket_low(int bucket) { return kSmallestBucketBytes << (2 * bucket); }

}  // namespace

double bus_factor(const std::string& op, int ranks) {
  if (ranks < 2) return 0;
  const double n = ranks;
  if (is_all_reduce(op)) return 2 * (n - 1) / n;
  if (contains(op, "reduce_scatter") || contains(op, "all_gather") || contains(op, "allgather") ||
      contains(op, "all_to_all") || contains(op, "alltoall"))
    return (n - 1) / n;
  if (contains(op, "broadcast") || op == "reduce") return 1;
  return 0;
}

int size_bucket(int64_t bytes) {
  if (bytes < kSmallestBucketBytes) return -1;
  int bucket = 0;
  while (bucket < 12 && bucket_low(bucket + 1) <= bytes) ++bucket;
  return bucket;
}

std::string size_bucket_label(int bucket) {
  return fmt::format("{}-{}", human_bytes(static_cast<double>(bucket_low(bucket))),
                     human_bytes(static_cast<double>(bucket_low(bucket + 1))));
}

void BandwidthWatch::set_floor(int64_t bytes, double busbw) {
  if (bytes > 0 && busbw > 0) floor_.emplace(bytes, busbw);
}

void BandwidthWatch::add(const CollectiveTiming& timing) {
  const double factor = bus_factor(timing.op, static_cast<int>(timing.ranks.size()));
  const int bucket = size_bucket(timing.bytes);
  if (factor <= 0 || bucket < 0 || timing.seconds <= 0) return;
  Kind& kind = kinds_[{timing.group, timing.op, bucket}];
  kind.ranks = timing.ranks;
  ++kind.collectives;
  kind.window.push_back(
      {timing.done_ns, factor * static_cast<double>(timing.bytes), timing.seconds});
}

std::optional<std::tuple<double, double, double>> BandwidthWatch::measure(const Kind& kind,
                                                                          int64_t wall_ns) const {
  if (kind.window.size() < kMinTimedCollectives) return std::nullopt;
  double bytes = 0, seconds = 0;
  for (const Timed& timed : kind.window) {
    bytes += timed.bus_bytes;
    seconds += timed.seconds;
  }
  const double span_s = std::max(settings_.window_s / 2,
                                 static_cast<double>(wall_ns - kind.window.front().done_ns) / 1e9);
  // The mean, not the median: gloo runs a step's buckets side by side, and the time they share
  // counts once, with the first to start.
  return std::make_tuple(bytes / seconds, seconds / static_cast<double>(kind.window.size()),
                         std::min(1.0, seconds / span_s));
}

std::optional<std::string> BandwidthWatch::check(Clock::time_point now,
                                                 std::chrono::system_clock::time_point wall,
                                                 const CpuWaitShare& cpu_wait_share) {
  const int64_t wall_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(wall.time_since_epoch()).count();
  std::optional<std::pair<Key, SlowCollective>> slowest;
  bool recovered = false;  // The slow kind was measured, and not slow.
  for (auto& [key, kind] : kinds_) {
    std::sort(kind.window.begin(), kind.window.end(),
              [](const Timed& a, const Timed& b) { return a.done_ns < b.done_ns; });
    while (!kind.window.empty() &&
           static_cast<double>(wall_ns - kind.window.front().done_ns) / 1e9 > settings_.window_s)
      kind.window.pop_front();
    const auto measured = measure(kind, wall_ns);
    if (!measured) continue;
    const auto [busbw, mean_s, busy_share] = *measured;
    SlowCollective slow;
    std::tie(slow.group, slow.op) = std::tie(std::get<0>(key), std::get<1>(key));
    slow.size = size_bucket_label(std::get<2>(key));
    slow.ranks = kind.ranks;
    slow.busbw_now = busbw;
    slow.mean_s = mean_s;
    slow.busy_share = busy_share;
    // The median of the earlier checks: one lucky window makes no baseline.
    if (!kind.healthy.empty()) {
      std::vector<double> earlier(kind.healthy.begin(), kind.healthy.end());
      std::nth_element(earlier.begin(),
                       earlier.begin() + static_cast<std::ptrdiff_t>(earlier.size() / 2),
                       earlier.end());
      slow.busbw_before = earlier[earlier.size() / 2];
    }
    if (floor_ && is_all_reduce(slow.op) && size_bucket(floor_->first) <= std::get<2>(key) &&
        floor_->second > slow.busbw_before) {
      slow.busbw_before = floor_->second;  // --preflight's all-reduce, at this size or smaller.
      slow.before_is_preflight = true;
    }
    spdlog::debug(
        "bandwidth watch: {} {} {} on group {}: {}, before {}, mean {:.3f} s, busy {:.0f}%",
        slow.op, slow.size, kind.window.size(), slow.group, gbps(busbw), gbps(slow.busbw_before),
        mean_s, 100 * busy_share);
    kind.under_share = busbw < settings_.slow_collective_share * slow.busbw_before &&
                       mean_s >= settings_.slow_collective_min_s;
    // A window under the share is no baseline, named slow or not: a slowdown's first windows
    // would lower the figure it is judged against.
    const auto keep_healthy = [&kind = kind, busbw = busbw] {
      if (kind.under_share) return;
      kind.healthy.push_back(busbw);
      if (kind.healthy.size() > kHealthyFigures) kind.healthy.pop_front();
    };
    // Half a window before a judgement, as for stragglers (the first steps are no pattern); the
    // baseline counts from the first few, since a link may slow down before then.
    if (static_cast<double>(wall_ns - kind.window.front().done_ns) / 1e9 < settings_.window_s / 2) {
      keep_healthy();
      continue;
    }
    // A slow kind takes real time: a share of the window, each one at least the minimum.
    const bool slow_now = kind.under_share && busy_share >= settings_.min_step_share;
    if (!slow_now) {
      recovered |= current_ && key == current_key_;
      kind.slow_since_ns.reset();
      keep_healthy();
      continue;
    }
    // Its ranks waited for a CPU: the box is loaded, and no link is to blame. Neither slow nor
    // a healthy figure for the baseline.
    if (const double waited = cpu_wait_share ? cpu_wait_share(slow.ranks) : 0;
        waited >= kStarvedRunDelayShare) {
      spdlog::debug(
          "bandwidth watch: {} {} on group {} is slow, but its ranks waited for a CPU {:.0f}% of "
          "the time: not named",
          slow.op, slow.size, slow.group, 100 * waited);
      kind.slow_since_ns.reset();
      kind.under_share = false;
      continue;
    }
    // ...and stays slow for a third of a window: a burst of load on the box is no slow link, and
    // a link that collapses is named within a minute of the default window, under ASan too.
    if (!kind.slow_since_ns) kind.slow_since_ns = wall_ns;
    if (static_cast<double>(wall_ns - *kind.slow_since_ns) / 1e9 < settings_.window_s / 3) continue;
    if (!slowest ||
        busbw / slow.busbw_before < slowest->second.busbw_now / slowest->second.busbw_before)
      slowest.emplace(key, std::move(slow));
  }
  if (current_ && slowest && slowest->first == current_key_) {
    episodes_.back().last_seen = wall;
    return std::nullopt;
  }
  // A window that emptied (the job ended its steps, or stalls) says neither slow nor gone.
  if (current_ && !recovered) return std::nullopt;
  if (!slowest && !current_) return std::nullopt;
  if (last_line_ && std::chrono::duration<double>(now - *last_line_).count() < settings_.window_s)
    return std::nullopt;
  last_line_ = now;
  if (!slowest) {
    current_ = false;
    const SlowCollective& ended = episodes_.back();
    return fmt::format(
        "slow collective gone: {} of {} on group {} runs at over {:.0f}% of its earlier bandwidth "
        "again",
        ended.op, ended.size, ended.group, 100 * settings_.slow_collective_share);
  }
  slowest->second.first_seen = slowest->second.last_seen = wall;
  episodes_.push_back(std::move(slowest->second));
  current_ = true;
  current_key_ = slowest->first;
  return describe(episodes_.back());
}

std::string BandwidthWatch::describe(const SlowCollective& slow) const {
  return fmt::format(
      "slow collective: {} of {} on group {} (ranks {}) runs at {} bus bandwidth, under {:.0f}% of "
      "the {} {}; one takes {} on average, {:.0f}% of the last {:.0f} s",
      slow.op, slow.size, slow.group, format_cpulist(slow.ranks), gbps(slow.busbw_now),
      100 * settings_.slow_collective_share, gbps(slow.busbw_before),
      slow.before_is_preflight ? "that --preflight measured" : "it ran at earlier in this job",
      human_duration(slow.mean_s), 100 * slow.busy_share, settings_.window_s);
}

bool BandwidthWatch::runs_slow(const std::string& group, int rank) const {
  return std::any_of(kinds_.begin(), kinds_.end(), [&](const auto& entry) {
    const auto& [key, kind] = entry;
    const bool slow = kind.under_share || kind.slow_since_ns || (current_ && key == current_key_);
    return slow && std::get<0>(key) == group &&
           std::binary_search(kind.ranks.begin(), kind.ranks.end(), rank);
  });
}

std::vector<BandwidthFigure> BandwidthWatch::figures() const {
  std::vector<BandwidthFigure> figures;
  for (const auto& [key, kind] : kinds_) {
    double bytes = 0, seconds = 0;
    for (const Timed& timed : kind.window) {
      bytes += timed.bus_bytes;
      seconds += timed.seconds;
    }
    figures.push_back({std::get<0>(key), std::get<1>(key), size_bucket_label(std::get<2>(key)),
                       seconds > 0 ? bytes / seconds : 0, kind.collectives});
  }
  return figures;
}

}  // namespace mcprun
