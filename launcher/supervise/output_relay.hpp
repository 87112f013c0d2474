// Relays each worker's stdout/stderr: whole lines and "\r" progress updates, prefixed "[rankN]:"
// (or as TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE says) on the console, copied byte for byte to
// per-rank log files, with a short tail kept for the failure report. Where mcprun's own stream is
// a terminal, the worker's is a pseudo-terminal of its own, as it would be under a plain shell.
#pragma once

#include <sys/ioctl.h>

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
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

/// `text` without terminal control sequences (colours, cursor moves) or other control bytes but
/// tabs: what a report or a JSON summary may quote of a worker's output.
std::string printable_text(std::string_view text);

/// How many columns `text` takes on a terminal: its characters, control sequences left out.
size_t display_width(std::string_view text);

/// The window of a rank's pseudo-terminal: the console's less the columns of the prefix mcprun
/// puts before each of its lines, so that a bar the worker draws as wide as its terminal fills
/// the console's line and never wraps ("\r" returns to the start of the wrapped part only).
winsize rank_window(const winsize& console, std::string_view prefix);

/// How much of a progress update's text can be shown now: all of it but an unfinished UTF-8
/// character or control sequence at its end, which a later read completes.
size_t complete_length(std::string_view text);

/// One of mcprun's own output streams, shared by every rank's relay. It remembers whose progress
/// line the cursor sits on, so that nothing is written into the middle of a line. On a terminal
/// one progress line stays at the bottom, the bar last updated: another rank's line goes above
/// it, another rank's update takes its place, and a bar that gave way is written out as a line
/// when it ends. Where nothing can be erased, another rank's output first ends the line.
class Console {
 public:
  explicit Console(int fd);
  /// mcprun's other stream: where it is the same terminal or file as `other`'s (stdout and
  /// stderr on one screen), both share one cursor, so that a line on either stream never lands
  /// at the end of a progress line drawn on the other.
  Console(int fd, const Console& other);
  bool is_terminal() const { return terminal_; }
  /// The terminal's size; nullopt when the stream is no terminal.
  std::optional<winsize> window_size() const;
  /// A whole line of `source`'s, in one write; it replaces `source`'s progress line, or goes
  /// above another's.
  void write_line(const void* source, std::string_view prefix, std::string_view text);
  /// A progress update: rewrites `source`'s open line in place ("\r"), the cursor left after it;
  /// on a terminal it takes the place of another's progress line, elsewhere it ends it.
  void write_progress(const void* source, std::string_view prefix, std::string_view text);
  /// `source` ended its progress line with a bare newline: `text`, the update it showed last,
  /// stays as a line (written again where another's bar took its place).
  void end_progress(const void* source, std::string_view prefix, std::string_view text);

 private:
  /// Where the cursor is, as the relays left it; one per screen, so shared by the two streams
  /// where they are one.
  struct Cursor {
    const void* open_line = nullptr;  ///< Whose progress line the cursor ends, or nullptr.
    std::string drawn;  ///< That line as written ("\r", prefix, text), to draw again below a line.
  };
  void write(std::string_view text);

  int fd_;
  bool terminal_;
  std::shared_ptr<Cursor> cursor_ = std::make_shared<Cursor>();
};

/// Where one stream of one rank goes.
struct StreamRoute {
  bool to_console = true;
  std::filesystem::path log_file;  ///< Empty: no log file.
};

/// Reads one worker's two output streams on the event loop.
class RankOutput {
 public:
  /// Creates a pipe per stream, or a pseudo-terminal where the stream goes to a console that is
  /// a terminal; `child_stdout()`/`child_stderr()` are the ends to hand to spawn.
  RankOutput(boost::asio::io_context& io, std::string prefix, StreamRoute out, StreamRoute err,
             Console& out_console, Console& err_console);
  ~RankOutput() { finish(); }
  RankOutput(const RankOutput&) = delete;
  RankOutput& operator=(const RankOutput&) = delete;

  int child_stdout() const { return child_ends_[0].get(); }
  int child_stderr() const { return child_ends_[1].get(); }
  /// Whether either stream is a pseudo-terminal, which a window size change concerns.
  bool on_terminal() const { return streams_[0].terminal || streams_[1].terminal; }
  /// Gives each pseudo-terminal the console's new window size, less the prefix (rank_window).
  void resize(const winsize& size);
  /// Closes our copies of the child's ends (after spawn), so EOF arrives when the child exits.
  void close_child_ends();
  /// Starts reading both streams.
  void start();
  /// Both streams reached EOF.
  bool drained() const { return open_streams_ == 0; }
  /// Flushes partial lines and stops reading (used when a drain deadline passes).
  void finish();
  /// The last lines as written (a progress line's last state); reports quote them through
  /// printable_text().
  const std::deque<std::string>& tail() const { return tail_; }
  /// When the rank last printed a line or a progress update (or started, before that).
  std::chrono::steady_clock::time_point last_output() const { return last_output_; }
  /// From now on, stderr lines go to `sink` (and the log file) instead of the console (nullptr
  /// stops): how the stall path keeps the Python tracebacks faulthandler prints.
  void copy_stderr_to(std::vector<std::string>* sink) { stderr_copy_ = sink; }

 private:
  struct Stream {
    std::unique_ptr<boost::asio::posix::stream_descriptor> reader;
    StreamRoute route;
    Console* console = nullptr;
    bool terminal = false;  ///< The reader is a pseudo-terminal's master.
    std::FILE* log = nullptr;
    std::string partial;    ///< The line's text since its last "\r" or its start.
    std::string shown;      ///< The progress update last written for this line.
    bool carriage = false;  ///< The line has had a "\r": it is a progress line.
    std::array<char, 16384> buffer;
  };
  /// The stream's reading end; its writing end goes to child_ends_[index].
  UniqueFd open_stream(Stream& stream, int index);
  void read_more(Stream& stream);
  void relay(Stream& stream, std::string_view chunk);
  /// Shows the line's latest state; unless `whole` (a "\r" ended it), an unfinished character
  /// or control sequence at its end waits for the next read.
  void show_progress(Stream& stream, bool whole);
  void end_line(Stream& stream);
  void close_stream(Stream& stream);
  /// Appends to the stream's log file; the first write that fails (a full disk) is said once and
  /// ends that file, so that a lost log is never silent.
  void write_log(Stream& stream, std::string_view chunk);
  void close_log(Stream& stream);

  std::string prefix_;
  Stream streams_[2];
  UniqueFd child_ends_[2];
  std::deque<std::string> tail_;
  std::chrono::steady_clock::time_point last_output_ = std::chrono::steady_clock::now();
  std::vector<std::string>* stderr_copy_ = nullptr;
  int open_streams_ = 0;
};

}  // namespace mcprun
