// How the job ended, for CI: --summary-json (one JSON document) and --junit (one test case per
// rank), written once when mcprun ends, whatever ended it.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/expected.hpp"
#include "launcher/config/launch_config.hpp"
#include "launcher/diagnose/failure_hints.hpp"
#include "launcher/supervise/failure_report.hpp"
#include "launcher/supervise/worker_group.hpp"
#include "launcher/watch/stall_report.hpp"

namespace mcprun {

class LastErrorSink;

/// What launch() saw of the job's attempts, turned into the CI files when mcprun ends.
class RunSummary {
 public:
  /// Writes nothing without --summary-json and --junit, or under --dry-run.
  RunSummary(const LaunchConfig& config, std::string host);
  ~RunSummary();
  RunSummary(const RunSummary&) = delete;
  RunSummary& operator=(const RunSummary&) = delete;

  /// An attempt starts: its ranks' durations count from here.
  void begin_attempt();
  /// An attempt ended; the last one recorded is the one the files describe. Each rank's error
  /// file is read now, while the run folder still exists.
  void end_attempt(const AttemptResult& result, const AttemptFiles& files, int world_size);

  /// Every node's view of its ranks when the current attempt stalled. launch() collects the
  /// reports straight into it; it marks the ranks the others waited for, as the report's `*`.
  std::vector<RankProgress> stall_ranks;

  /// What the last attempt's failure means for this job (diagnose/failure_hints): its `hint`.
  void set_hint(std::string hint) { hint_ = std::move(hint); }
  /// The rank whose clean exit the failing rank's lost peer most likely was: its `early_finisher`.
  void set_early_finisher(std::optional<EarlyFinisher> finisher) { early_finisher_ = finisher; }
  /// The stragglers the last attempt named: its `stragglers`.
  void set_stragglers(std::vector<StragglerEpisode> stragglers) {
    stragglers_ = std::move(stragglers);
  }
  /// The slow collectives the last attempt named: its `slow_collectives`.
  void set_slow_collectives(std::vector<SlowCollective> slow) {
    slow_collectives_ = std::move(slow);
  }
  /// --preflight's report (docs/preflight.md), as the check wrote it; its text left out.
  void set_preflight(nlohmann::json report) { preflight_ = std::move(report); }

  /// The --summary-json document, for mcprun's exit code.
  nlohmann::ordered_json format_json(int exit_code) const;
  /// The --junit document, for mcprun's exit code.
  std::string format_junit(int exit_code) const;
  /// Makes the files' folders and tries a file in each, before the job starts: a path that
  /// cannot be written is bad input, better refused now than found out when the job ends.
  Expected<void> check_writable() const;
  /// Writes the files that were asked for, each atomically (a temp file renamed over it).
  void write(int exit_code) const;

 private:
  /// One local rank of the last attempt.
  struct Rank {
    WorkerOutcome outcome;
    std::optional<RecordedError> recorded;  ///< What torch's @record wrote, if it did.
    double duration_s = 0;
    std::filesystem::path stdout_log, stderr_log;  ///< Empty: not kept.
  };
  /// The job's result word (success|failed|stalled|timeout|interrupted|cancelled) and one-line root
  /// cause.
  struct Verdict {
    std::string result;
    std::string root_cause;
  };
  Verdict verdict(int exit_code) const;
  nlohmann::ordered_json stragglers_json() const;
  nlohmann::ordered_json slow_collectives_json() const;
  /// "rank 1 on host exited with exit code 7: ValueError: bad shard 17".
  std::string rank_ending(const Rank& rank) const;
  /// This rank's place in the stall report, when the last attempt stalled.
  const RankProgress* stall_progress(int rank) const;
  /// The stall report marks it: a rank the others were waiting for.
  bool stalled(int rank) const;
  bool root_cause(size_t index) const;

  bool active_;
  std::string host_, rdzv_id_, summary_json_, junit_;
  double job_timeout_;
  bool under_slurm_;  ///< kExitSlurmCancelled then means Slurm's SIGTERM ended the job.
  std::chrono::system_clock::time_point started_;
  std::chrono::steady_clock::time_point started_steady_;
  std::chrono::system_clock::time_point attempt_started_;
  int attempts_ = 0;
  int world_size_ = 0;
  std::optional<AttemptResult> last_;  ///< The last attempt's ending; its workers are in ranks_.
  std::vector<Rank> ranks_;
  std::string hint_;  ///< The last attempt's, when it failed or stalled; empty: none.
  std::optional<EarlyFinisher> early_finisher_;   ///< The last attempt's, when it failed.
  std::vector<StragglerEpisode> stragglers_;      ///< The last attempt's.
  std::vector<SlowCollective> slow_collectives_;  ///< The last attempt's.
  nlohmann::json preflight_;                      ///< null: no --preflight ran.
  std::shared_ptr<LastErrorSink> last_error_;     ///< Explains an ending that no attempt does.
};

/// Text made safe for XML 1.0 character data and attribute values alike: markup characters and
/// whitespace other than a space become references, and what XML 1.0 cannot carry at all
/// (control characters, invalid UTF-8) becomes a visible "\xNN".
std::string xml_escape(std::string_view text);

}  // namespace mcprun
