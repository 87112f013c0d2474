// The collective watchdog: every rank's reporter (worker_helper/mcprun/_progress.py, injected
// through sitecustomize) publishes its collective progress in the job store; the node that serves
// the store judges from all of them, across nodes, whether the job has stopped making progress.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/expected.hpp"
#include "common/process_state.hpp"

namespace mcprun {

/// Seconds from `from` to `to` on the watches' clock.
inline double seconds_between(std::chrono::steady_clock::time_point from,
                              std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

/// Where the reporters publish: one key per rank, "<prefix><rank>". Keys are as torch's TCPStore
/// client sends them, with a "/" of its own before the key the reporter names.
inline constexpr std::string_view kProgressKeyPrefix = "/mcprun/progress/";
/// Set by mcprun on a collective stall: each reporter then writes its Flight Recorder dump to
/// TORCH_FR_DUMP_TEMP_FILE<rank>.
inline constexpr std::string_view kFlightRecorderDumpKey = "/mcprun/flight_recorder/dump";
/// How long the stall path waits for the ranks' Flight Recorder dumps.
inline constexpr std::chrono::seconds kFlightRecorderDumpTimeout{5};
/// How often each reporter publishes (MCPRUN_PROGRESS_INTERVAL_S, which tests shorten).
inline constexpr double kProgressIntervalSeconds = 1.0;
/// A rank outside any collective that used this share of a core since its last look, or whose
/// main thread ran or waited for a CPU that long, is busy (evaluating, checkpointing): progress.
/// The reporter itself costs well under 1 %; a computing thread on a loaded box waits for the
/// CPU it does not get, so running plus waiting is near 100 % whatever its share.
inline constexpr double kBusyCpuShare = 0.1;
/// A rank whose records stopped for this many intervals is reported as silent.
inline constexpr double kStaleIntervals = 5;
/// What a silent rank's state adds where only the node that runs it can tell (/proc) which.
inline constexpr std::string_view kSilentReporterGuess =
    " (its reporter cannot run: a call holding the GIL, or its process stopped?)";

/// A collective a rank has started and not finished.
struct PendingCollective {
  std::string group;             ///< The process group's name: "0" is the default group.
  std::vector<int> group_ranks;  ///< Its members' global ranks; empty when unknown.
  std::string op;                ///< "all_reduce", "barrier", "broadcast"...
  int64_t seq = -1;              ///< Its sequence number in the group; -1: unknown (torch 1.x).
  std::string backend;           ///< "gloo", "nccl"; empty when unknown.
  double pending_s = 0;          ///< How long it had been pending when the record was made.
  /// torch 1.x: DDP's gradient all-reduce, seen as backward() after DDP issued collectives in
  /// it. A rank busy there is computing gradients: progress, as outside a collective.
  bool in_backward = false;
};

/// When one rank enqueued collectives of one group (torch 2.x's Flight Recorder).
struct GroupArrivals {
  std::vector<int> group_ranks;  ///< Its members' global ranks; empty when unknown or many.
  struct Arrival {
    int64_t seq = 0;
    int64_t created_ns = 0;  ///< On the rank's wall clock.
    int64_t elements = 0;    ///< Of its inputs.
    int64_t done_ns = -1;    ///< When the rank saw it completed, on its wall clock; -1: unknown.
    int64_t bytes = 0;       ///< nccl-tests' size: the larger of its inputs and outputs.
    std::string op;          ///< "all_reduce", "_allgather_base"...; empty from an older reporter.
    double gpu_s = -1;       ///< Its time on the GPU (TORCH_NCCL_ENABLE_TIMING); -1: unknown.
  };
  std::vector<Arrival> arrivals;  ///< By sequence number.
  double step_s = 0;  ///< The rank's step, from the period of the group's collectives; 0: none.
  int period = 0;     ///< Collectives a step: that period; 0: none.
};

/// One record of one rank's reporter.
struct ProgressRecord {
  int rank = 0;
  int pid = 0;
  int64_t number = 0;      ///< Counts up per record.
  std::string source;      ///< "flight_recorder" (torch 2.x) or "stack" (torch 1.x).
  int64_t completed = -1;  ///< Collectives this rank completed, all groups; -1: unknown.
  std::vector<PendingCollective> pending;  ///< Oldest first.
  double cpu_s = 0;                        ///< CPU time of the rank and its live descendants.
  std::vector<std::string> frames;         ///< The main thread's innermost frames, innermost last.
  /// Set at interpreter exit: the rank left its collectives; `pending` is what it was in before.
  bool exiting = false;
  std::string host;  ///< Where the rank runs; empty from an older reporter.
  int local_rank = -1;
  double run_delay_s = 0;  ///< Its main thread's wait for a CPU (/proc schedstat).
  double loader_s = -1;    ///< Its main thread's wall time in torch's DataLoader; -1: untimed.
  /// Its cgroup's CPU quota in cores, and the cgroup's periods and throttled periods so far;
  /// quota 0: none.
  double cpu_quota_cores = 0;
  int64_t cpu_periods = 0, cpu_throttled_periods = 0;
  int64_t sent_ns = 0;  ///< Its wall clock when it made the record; 0: unknown.
  std::map<std::string, GroupArrivals> arrivals;  ///< By group name; empty in most records.
};

/// Parses a reporter's record; an Error names what was wrong (a record is never trusted).
Expected<ProgressRecord> parse_progress_record(std::string_view text);

/// What the watchdog found: the collective, who is in it, and where every other member is.
struct CollectiveStall {
  PendingCollective collective;
  std::vector<int> in;                ///< Members waiting in it.
  std::vector<int> missing;           ///< Members that are not.
  std::map<int, std::string> states;  ///< Every known rank: where it is, in words.
  bool mismatch = false;              ///< A missing member is in another collective.
  std::string source;                 ///< Where the facts came from, for the report.
};

nlohmann::json to_json(const CollectiveStall& stall);
/// The stall in about `max_bytes` of JSON at most, for one rendezvous frame at any job size: rank
/// lists as ranges ("0-4095,4097-16383"), the states grouped by text, the most ranks first.
/// What does not fit is left out and counted: "<list>_left_out" ranks, "states_left_out" ranks.
nlohmann::json to_compact_json(const CollectiveStall& stall, size_t max_bytes);
/// Reads both forms; throws std::exception (a json error) on a malformed stall.
CollectiveStall collective_stall_from_json(const nlohmann::json& json);
/// "all_reduce #30 on group 0 (gloo)": the collective as the report names it.
std::string describe(const PendingCollective& collective);

/// Judges stalls from the ranks' records: no collective completed on any rank and no rank
/// outside a collective busy, for the whole timeout, while a collective is pending.
class CollectiveWatch {
 public:
  using Clock = std::chrono::steady_clock;
  CollectiveWatch(double timeout_s, double interval_s, Clock::time_point now);

  void observe(ProgressRecord record, Clock::time_point now);
  /// What this node's kernel counts of `pid`, which runs `rank`: busy evidence that no late or
  /// missing record can hold back (a reporter that has sent nothing yet, or that waits for the
  /// GIL behind a main thread in a long C call, or is starved of CPU). It counts where the rank's
  /// CPU would: outside a collective by its last record, in backward(), or with no record yet.
  void observe_kernel(int rank, pid_t pid, const ProcessActivity& activity, Clock::time_point now);
  /// A local rank ended; "exit code 0".
  void rank_ended(int rank, std::string how);
  /// The stall, once the job has made no progress for the timeout with a collective pending.
  std::optional<CollectiveStall> check(Clock::time_point now) const;
  /// Where each rank was at its last record, when any was in a collective: what a failure
  /// report adds when a rank failed in one (a process-group timeout shorter than mcprun's).
  std::map<int, std::string> ranks_in_collectives(Clock::time_point now) const;
  /// When each rank's exiting record arrived: its script had ended (the early finisher's clue).
  const std::map<int, std::chrono::system_clock::time_point>& exiting_at() const {
    return exiting_at_;
  }

 private:
  struct RankView {
    ProgressRecord last;
    Clock::time_point received;
  };
  /// observe_kernel's last look at a rank's process.
  struct KernelSample {
    pid_t pid = 0;
    ProcessActivity activity;
    Clock::time_point at;
  };
  /// Where `rank` is; a pending call other than `stalled` (when given) is named a mismatch.
  std::string state_of(int rank, const PendingCollective* stalled, Clock::time_point now) const;
  /// Reaped, or its interpreter is exiting: in no collective, whatever its last call was.
  bool gone(int rank) const;

  double timeout_s_;
  double interval_s_;
  Clock::time_point last_progress_;
  std::map<int, RankView> ranks_;
  std::map<int, KernelSample> kernel_;
  std::map<int, std::string> ended_;
  std::map<int, std::chrono::system_clock::time_point> exiting_at_;
};

}  // namespace mcprun
