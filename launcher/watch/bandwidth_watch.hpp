// The bandwidth watch: a collective that became slow while the job runs. Each completed
// collective's bus bandwidth, as nccl-tests computes it, per group, op and size; a kind of
// collective whose window runs under a share of what the same job measured earlier (or of
// --preflight's floor) is named, with the ranks in it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "launcher/config/launch_config.hpp"

namespace mcprun {

/// One collective every member completed, timed on the store host's clock.
struct CollectiveTiming {
  std::string group;
  std::string op;
  int64_t bytes = 0;
  std::vector<int> ranks;  ///< Its members, ascending.
  double seconds = 0;      ///< From the last arrival (or the group's previous completion) to done.
  int64_t done_ns = 0;     ///< On the store host's wall clock.
};

/// nccl-tests' bus bandwidth factor for `op` among `ranks` members: all-reduce 2(n-1)/n;
/// reduce-scatter, all-gather and all-to-all (n-1)/n; broadcast and reduce 1. 0: an op whose
/// bytes say nothing of a link (barrier, send, scatter).
double bus_factor(const std::string& op, int ranks);

/// Which size a collective counts under: powers of 4 from 64 KiB (smaller ones are latency-bound,
/// their bandwidth no figure of a link); -1: under 64 KiB.
int size_bucket(int64_t bytes);
/// "1-4 MiB": the bucket's bounds.
std::string size_bucket_label(int bucket);

/// A kind of collective that ran slow, from the check that named it to the last that still did.
struct SlowCollective {
  std::string group, op, size;  ///< size: its bucket's label.
  std::vector<int> ranks;
  double busbw_before = 0;  ///< Bytes/s: the median of the earlier checks, or the floor.
  bool before_is_preflight = false;
  double busbw_now = 0;
  double mean_s = 0;      ///< One collective's time, in the window that named it.
  double busy_share = 0;  ///< Of the window spent in these collectives.
  std::chrono::system_clock::time_point first_seen, last_seen;
};

/// A kind of collective's figure now: what `--metrics-port` serves.
struct BandwidthFigure {
  std::string group, op, size;
  double busbw = 0;          ///< Bytes/s over the window.
  uint64_t collectives = 0;  ///< Timed since the attempt began.
};

/// A main thread that waited for a CPU this share of the time is starved: its collectives are slow
/// because the box's CPU is taken, not because of a link.
inline constexpr double kStarvedRunDelayShare = 0.2;

class BandwidthWatch {
 public:
  using Clock = std::chrono::steady_clock;
  explicit BandwidthWatch(StragglerSettings settings) : settings_(settings) {}

  /// --preflight's all-reduce bus bandwidth at `bytes`: a floor for all-reduces that large.
  void set_floor(int64_t bytes, double busbw);
  void add(const CollectiveTiming& timing);
  /// The median share of the window that `ranks`' main threads waited for a CPU.
  using CpuWaitShare = std::function<double(const std::vector<int>& ranks)>;
  /// One line at most a window: a slow collective named, or gone. A kind whose ranks were starved
  /// of CPU (`cpu_wait_share`, when given) is not named: a loaded box slows gloo's reductions too.
  std::optional<std::string> check(Clock::time_point now,
                                   std::chrono::system_clock::time_point wall,
                                   const CpuWaitShare& cpu_wait_share = {});
  /// A kind of collective on `group` with `rank` in it ran under its share of its earlier bandwidth
  /// at the last check: named, or not yet (too short a time, or too small a share of the window).
  bool runs_slow(const std::string& group, int rank) const;
  std::vector<BandwidthFigure> figures() const;
  const std::vector<SlowCollective>& episodes() const { return episodes_; }
  const SlowCollective* current() const { return current_ ? &episodes_.back() : nullptr; }

 private:
  using Key = std::tuple<std::string, std::string, int>;  ///< Group, op, size bucket.
  struct Timed {
    int64_t done_ns = 0;
    double bus_bytes = 0;  ///< Bytes times the bus factor.
    double seconds = 0;
  };
  struct Kind {
    std::deque<Timed> window;
    std::vector<int> ranks;
    std::deque<double> healthy;  ///< Bytes/s: each check's full window while it was not slow.
    std::optional<int64_t> slow_since_ns;
    /// Under the share of its earlier bandwidth at the last check, whatever its share of the time.
    bool under_share = false;
    uint64_t collectives = 0;
  };
  /// A full window's bandwidth, mean time per collective and busy share; nullopt when too few.
  std::optional<std::tuple<double, double, double>> measure(const Kind& kind,
                                                            int64_t wall_ns) const;
  std::string describe(const SlowCollective& slow) const;

  StragglerSettings settings_;
  std::optional<std::pair<int64_t, double>> floor_;
  std::map<Key, Kind> kinds_;
  std::vector<SlowCollective> episodes_;
  bool current_ = false;
  Key current_key_;
  std::optional<Clock::time_point> last_line_;
};

}  // namespace mcprun
