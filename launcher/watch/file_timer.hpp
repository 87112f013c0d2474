// torch's FileTimerServer, served by mcprun: workers that use
// torch.distributed.elastic.timer.FileTimerClient (timer.expires(after=...)) send acquire and
// release requests as JSON lines into a FIFO; a scope that outlives its expiration is a stall.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/expected.hpp"

namespace mcprun {

/// Longest request line accepted: torch's client refuses to send more than PIPE_BUF bytes.
inline constexpr size_t kMaxTimerRequestBytes = 4096;

/// A scope whose expiration passed before its release.
struct ExpiredTimer {
  pid_t pid = 0;
  std::string scope_id;
  double expiration_time = 0;  ///< Epoch seconds, as the client sent it.
  int signal = 0;              ///< What the client asked to be killed with (0: none).
};

/// One JSON line of torch's FileTimerClient: acquire (expiration_time >= 0) or release.
struct TimerRequest {
  pid_t pid = 0;
  std::string scope_id;
  double expiration_time = 0;  ///< Epoch seconds; negative: release.
  int signal = 0;
};

/// Parses one request line (without its newline); the reason it is ignored otherwise. Blank
/// lines are an empty reason.
Expected<TimerRequest> parse_timer_request(std::string_view line);

/// Keeps timers keyed by (pid, scope_id) like torch's server and reports each expiry once.
/// Unlike torch's server it does not itself send the client's signal: mcprun treats an expiry as
/// a stall of that rank, and the launcher decides what to do (dump stacks, stop the group).
class FileTimerServer {
 public:
  /// Creates the FIFO at `path` (mode 0600, replacing a stale FIFO there) and starts reading it
  /// on `io`. `on_expired` runs on the loop, once per pid whose earliest expired scope it names;
  /// that pid's other timers are dropped with it, as torch's clear_timers does. Throws
  /// std::system_error naming the path on failure.
  FileTimerServer(boost::asio::io_context& io, std::filesystem::path path,
                  std::function<void(const ExpiredTimer&)> on_expired);
  /// Stops reading and unlinks the FIFO.
  ~FileTimerServer();
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  /// Where clients write: what the launcher exports as TORCHELASTIC_TIMER_FILE.
  const std::filesystem::path& path() const { return path_; }
  /// Drops every timer of `pid`, for a worker that exited.
  void clear_pid(pid_t pid);

 private:
  struct Session;  ///< The FIFO, the timers and the wake-up; shared with pending handlers.

  std::filesystem::path path_;
  std::shared_ptr<Session> session_;
};

}  // namespace mcprun
