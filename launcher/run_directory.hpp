// The run's folder: attempt_<n>/<local rank>/{stdout.log,stderr.log,error.json}, the preflight's
// passes, a stall's report and the picture of the last collectives.
#pragma once

#include <filesystem>
#include <memory>

#include "common/expected.hpp"
#include "launcher/config/launch_config.hpp"
#include "launcher/supervise/worker_group.hpp"

namespace mcprun {

/// Whether each rank's output is also written to files in the run folder.
bool keeps_log_files(const LaunchConfig& config);

/// Under --log-dir the folder is kept; otherwise it is a temp folder removed at exit unless logs
/// were asked for or something worth opening (a stall's report, the picture) was written there.
class RunDirectory {
 public:
  /// The one-line error names --log-dir when the folder was the user's choice.
  static Expected<std::unique_ptr<RunDirectory>> create(const LaunchConfig& config);
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;
  ~RunDirectory();

  AttemptFiles attempt(int restart_count) const;
  const std::filesystem::path& path() const { return path_; }
  /// Keeps the folder after all: it holds a stall's report and stack dumps.
  void keep();
  /// Where the FileTimer pipe and the helper's socket live: a unix socket path must stay short.
  std::filesystem::path runtime_dir();

 private:
  RunDirectory(std::filesystem::path path, bool keep) : path_(std::move(path)), keep_(keep) {}

  static constexpr size_t kUnixPathLimit = 100;  ///< sun_path holds 108 bytes.
  std::filesystem::path path_;
  std::filesystem::path runtime_;
  bool keep_ = false;
};

}  // namespace mcprun
