// Relays each worker's stdout/stderr: whole lines, prefixed "[rankN]:" (or as
// TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE says) on the console, copied to per-rank log files, with a
// short tail kept for the failure report.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/unique_fd.hpp"

namespace mcprun {

/// How many lines of a rank's output the failure report shows.
inline constexpr size_t kTailLines = 20;

/// A rank's console prefix: torchrun 2.x's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE when given
/// (string.Template's safe_substitute of ${rank}, ${local_rank}, ${role_name}; $$ is a "$";
/// anything else stays as written), else "[rankN]:" when there are several ranks, else nothing.
std::string console_prefix(const std::optional<std::string>& line_template, int rank,
                           int local_rank, const std::string& role_name, bool several_ranks);

/// Where one stream of one rank goes.
struct StreamRoute {
  bool to_console = true;
  std::filesystem::path log_file;  ///< Empty: no log file.
};

/// Reads one worker's two pipes on the event loop.
class RankOutput {
 public:
  /// Creates the pipes; `child_stdout()`/`child_stderr()` are the ends to hand to spawn.
  RankOutput(boost::asio::io_context& io, std::string prefix, StreamRoute out, StreamRoute err);
  ~RankOutput() { finish(); }
  RankOutput(const RankOutput&) = delete;
  RankOutput& operator=(const RankOutput&) = delete;

  int child_stdout() const { return child_ends_[0].get(); }
  int child_stderr() const { return child_ends_[1].get(); }
  /// Closes our copies of the child's ends (after spawn), so EOF arrives when the child exits.
  void close_child_ends();
  /// Starts reading both pipes.
  void start();
  /// Both pipes reached EOF.
  bool drained() const { return open_streams_ == 0; }
  /// Flushes partial lines and stops reading (used when a drain deadline passes).
  void finish();
  const std::deque<std::string>& tail() const { return tail_; }
  /// When the rank last printed a whole line (or started, before its first line).
  std::chrono::steady_clock::time_point last_output() const { return last_output_; }
  /// From now on, stderr lines go to `sink` (and the log file) instead of the console (nullptr
  /// stops): how the stall path keeps the Python tracebacks faulthandler prints.
  void copy_stderr_to(std::vector<std::string>* sink) { stderr_copy_ = sink; }

 private:
  struct Stream {
    std::unique_ptr<boost::asio::posix::stream_descriptor> pipe;
    StreamRoute route;
    std::FILE* log = nullptr;
    std::string partial;
    std::array<char, 16384> buffer;
    int console_fd;
  };
  void read_more(Stream& stream);
  void emit_line(Stream& stream, std::string_view line);
  void close_stream(Stream& stream);

  std::string prefix_;
  Stream streams_[2];
  UniqueFd child_ends_[2];
  std::deque<std::string> tail_;
  std::chrono::steady_clock::time_point last_output_ = std::chrono::steady_clock::now();
  std::vector<std::string>* stderr_copy_ = nullptr;
  int open_streams_ = 0;
};

}  // namespace mcprun
