// The straggler watch: which rank holds the others back while the job runs. DDP's all-reduce
// evens out every rank's step, so step times name nobody; what differs is who arrives last.
// Every rank's reporter sends when it enqueued its recent collectives (torch 2.x's Flight
// Recorder); the node that serves the job store lines them up per collective, on one clock.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launcher/config/launch_config.hpp"
#include "launcher/watch/bandwidth_watch.hpp"
#include "launcher/watch/collective_watch.hpp"

namespace mcprun {

/// Fewer collectives than this in the window say nothing about who is last.
inline constexpr int kMinStragglerCollectives = 20;

/// One straggler, from the check that named it to the last that still did.
struct StragglerEpisode {
  int rank = 0;
  std::string host;
  int local_rank = -1;
  std::string group;
  std::chrono::system_clock::time_point first_seen, last_seen;
  double share = 0;       ///< Of the window's steps at which it held the others back (arrived
                          ///< last, by the lag floor or more); of its collectives if no step shows.
  double cost_share = 0;  ///< Of the window's time the others spent waiting for it.
  double wait_share = 0;  ///< Of all the others' waits in the window, the part it caused.
  double median_lag_s = 0;  ///< Behind the median of the others, where it was last.
  int collectives = 0;      ///< At which it held the others back, in the window.
  double step_s = 0;        ///< The job's step over the window, from its collectives' pace.
  std::string cause;        ///< Where its time goes, in words.
  int cause_pid = 0;        ///< Its process, for the node that runs it to look at (CPU hogs).
};

/// A rank's collectives since the attempt began, as the store's host lined them up: what
/// `--metrics-port` serves.
struct RankArrivals {
  std::string host;
  int local_rank = -1;
  uint64_t collectives = 0;   ///< Completed ones it was in (every member's arrival seen).
  uint64_t arrived_last = 0;  ///< ...at which it arrived last.
  double waited_s = 0;        ///< Summed over them: from its arrival to the last one's.
  double lag_s = 0;           ///< At the latest it arrived last at: behind the others' median.
};

/// A collective every member arrived at, for the picture of the last ones.
struct SeenCollective {
  std::string group;
  int64_t seq = 0;
  std::vector<std::pair<int, int64_t>> arrivals;  ///< Rank, arrival ns on the store host's clock.
};

/// How many collectives the picture shows: a few hundred marks a row stay legible.
inline constexpr size_t kRecentCollectives = 300;
/// Rows the picture draws at most; the recent collectives keep the arrivals of ranks below this
/// and each one's last arrival, so that 16,384 ranks cost 65 arrivals a collective, not 16,384.
inline constexpr size_t kMaxPictureRows = 64;

/// Where a rank's time went over the window, from its records.
struct RankActivity {
  double cpu_share = 0;        ///< CPU time per wall second.
  double run_delay_share = 0;  ///< Waiting for a CPU per wall second.
  /// Of the wall clock, its main thread's time in torch's data loader; where the reporter could
  /// not time that, the share of its records whose frames were there.
  double data_loader_share = 0;
  double cpu_quota_cores = 0;  ///< Its cgroup's CPU quota at its last record; 0: none.
  double throttled_share = 0;  ///< Of its cgroup's periods, those in which it was throttled.
};

class StragglerWatch {
 public:
  using Clock = std::chrono::steady_clock;
  explicit StragglerWatch(StragglerSettings settings) : settings_(settings), bandwidth_(settings) {}

  /// A record as the store's host received it: `received_ns` on this host's wall clock.
  void observe(const ProgressRecord& record, int64_t received_ns, Clock::time_point now);
  /// What to tell the user now, at most one line a window: a straggler named, changed (another
  /// rank, or its lag doubled) or gone. `wall` stamps the episodes.
  std::optional<std::string> check(Clock::time_point now,
                                   std::chrono::system_clock::time_point wall);
  /// The straggler named now, if any.
  const StragglerEpisode* current() const { return current_ ? &episodes_.back() : nullptr; }
  /// Every straggler named in this attempt, oldest first.
  const std::vector<StragglerEpisode>& episodes() const { return episodes_; }
  /// Every rank seen in a completed collective, by rank.
  const std::map<int, RankArrivals>& arrivals() const { return arrivals_; }
  /// The last kRecentCollectives collectives every member arrived at, oldest first (the
  /// arrivals of ranks under kMaxPictureRows and the last one).
  const std::deque<SeenCollective>& recent() const { return recent_; }
  /// The collectives' bus bandwidth, timed from the same arrivals and their completions.
  BandwidthWatch& bandwidth() { return bandwidth_; }
  /// The median share of the window that `ranks`' main threads waited for a CPU (their records).
  double cpu_wait_share(const std::vector<int>& ranks) const;
  const BandwidthWatch& bandwidth() const { return bandwidth_; }

 private:
  struct Sample {
    int64_t seq = 0;
    int64_t last_created_ns = 0;  ///< The last arrival, on this host's wall clock.
    int last_rank = 0;
    double lag_s = 0;          ///< Behind the others' median arrival.
    double others_wait_s = 0;  ///< The others' mean wait for it: what it cost them.
    /// Its own gap from the previous collective's completion to this arrival was no longer than
    /// the others': it was late because the previous one finished last for it (a slow link on a
    /// ring), not from its own work. nullopt: completions unknown.
    std::optional<bool> late_from_previous;
  };
  struct Collective {
    std::map<int, int64_t> created_ns;  ///< Rank -> its arrival, on the rank's clock.
    std::map<int, int64_t> done_ns;     ///< Rank -> when it saw it completed, on its clock.
    double gpu_s = -1;                  ///< The shortest of its members' GPU times.
    int64_t bytes = 0;
    std::string op;
    std::vector<int> members;
    Clock::time_point first_seen;
  };
  struct RankRecord {
    Clock::time_point received;
    double cpu_s = 0, run_delay_s = 0;
    bool in_data_loader = false;
    double loader_s = -1;
    double cpu_quota_cores = 0;
    int64_t cpu_periods = 0, cpu_throttled_periods = 0;
  };
  /// Ranks' names and processes, from their latest records.
  struct RankInfo {
    std::string host;
    int local_rank = -1;
    int pid = 0;
  };
  void complete(const std::string& group, int64_t seq, const Collective& collective);
  /// Its time from the last arrival to done, on this host's clock, to the bandwidth watch.
  void time(const std::string& group, int64_t seq, const Collective& collective,
            int64_t last_arrival_ns);
  int64_t on_this_clock(int rank, int64_t rank_ns) const;
  std::optional<StragglerEpisode> judge(int64_t wall_ns) const;
  RankActivity activity(int rank) const;
  struct Cause {
    std::string text;
    bool its_own = false;  ///< False: none was found, and the text says what its CPU rules out.
  };
  /// Where the episode's rank's time goes: a quota, a CPU another takes, its data loader, or
  /// compute beyond the others' that accounts for its lateness.
  Cause cause_of(const StragglerEpisode& episode) const;
  std::string describe(const StragglerEpisode& episode, bool changed) const;

  StragglerSettings settings_;
  std::map<int, int64_t> offset_ns_;  ///< Rank -> the smallest (received - sent) seen.
  std::map<std::string, std::map<int64_t, Collective>> open_;  ///< group -> seq -> arrivals.
  std::map<std::string, std::deque<Sample>> samples_;          ///< group -> completed, by age.
  std::map<std::string, std::vector<int>> reporting_;          ///< group -> ranks seen in it.
  std::map<std::string, std::map<int, double>> steps_;         ///< group -> rank -> its step.
  std::map<std::string, std::map<int, int>> periods_;          ///< ...its collectives a step.
  std::map<int, std::deque<RankRecord>> history_;
  std::map<int, RankInfo> ranks_;
  std::map<int, RankArrivals> arrivals_;
  std::deque<SeenCollective> recent_;
  std::map<std::string, std::pair<int64_t, int64_t>> last_done_;  ///< group -> (seq, done ns).
  /// group -> the last completed collective's seq and each rank's completion, on this clock.
  std::map<std::string, std::pair<int64_t, std::map<int, int64_t>>> previous_done_;
  BandwidthWatch bandwidth_;
  std::vector<StragglerEpisode> episodes_;
  bool current_ = false;
  std::optional<Clock::time_point> last_line_;
};

}  // namespace mcprun
