// The root-cause report printed once when a group fails, in the spirit of torchrun's.
#pragma once

#include <chrono>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mcprun {

/// How one worker of a failed attempt ended.
struct WorkerOutcome {
  int rank = 0;
  int local_rank = 0;
  int pid = 0;
  int exit_code = 0;
  int signal = 0;
  bool stopped_by_launcher = false;  ///< It exited after mcprun began stopping the group.
  std::chrono::system_clock::time_point exit_time;
  std::deque<std::string> tail;
  std::filesystem::path error_file;
  bool failed() const { return signal != 0 || exit_code != 0; }
};

/// What torch's @record wrote: the exception message and Python traceback.
struct RecordedError {
  std::string message;
  std::string traceback;
  std::string timestamp;
};

/// Reads a TORCHELASTIC_ERROR_FILE; nullopt when absent or not the JSON torch writes.
std::optional<RecordedError> read_error_file(const std::filesystem::path& path);

/// The report for one failed attempt. `first_failure` indexes `workers`; `collectives` is where
/// each rank of the job was by the collective watchdog's last records (empty: nothing to say);
/// `hint` says what the root cause's error means for this job (empty: nothing recognised).
std::string format_failure_report(const std::vector<WorkerOutcome>& workers, size_t first_failure,
                                  const std::string& host, int restart_count, int max_restarts,
                                  const std::map<int, std::string>& collectives = {},
                                  const std::string& hint = "");

/// The lines a failure's hint is read from: the rank's last output, then what @record wrote.
std::vector<std::string> failure_text(const WorkerOutcome& worker);

/// mcprun's exit code for a worker's end: its own code, or 128 + signal.
int exit_code_for(const WorkerOutcome& worker);

}  // namespace mcprun
