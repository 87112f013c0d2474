#include "launcher/watch/file_timer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/buffer.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <chrono>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>
#include <system_error>
#include <utility>

#include "common/logging.hpp"
#include "common/unique_fd.hpp"

namespace mcprun {
namespace {

/// How much of a bad request a warning quotes.
constexpr size_t kQuotedRequestBytes = 200;
/// Most scopes held at once: a client inventing scope ids cannot grow the launcher unbounded.
constexpr size_t kMaxTimers = 100000;
/// Longest single sleep: a far-future expiration is re-checked rather than overflowing the timer.
constexpr std::chrono::hours kLongestWake{1};

double epoch_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// Which of two expired scopes of one pid to report: torch's server kills with the earliest
/// one that names a signal, so that one wins; otherwise the earliest.
bool reported_before(const ExpiredTimer& a, const ExpiredTimer& b) {
  if ((a.signal > 0) != (b.signal > 0)) return a.signal > 0;
  return a.expiration_time < b.expiration_time;
}

}  // namespace

struct FileTimerServer::Session : std::enable_shared_from_this<Session> {
  struct Timer {
    double expiration_time;
    int signal;
  };

  Session(boost::asio::io_context& io, std::string path,
          std::function<void(const ExpiredTimer&)> on_expired, UniqueFd read_end,
          UniqueFd write_end)
      : path(std::move(path)),
        on_expired(std::move(on_expired)),
        fifo(io, read_end.release()),
        write_end(std::move(write_end)),
        wake(io) {}

  void read_more();
  void consume(std::string_view chunk);
  void on_request(std::string_view line);
  /// Sets the one wake-up to the earliest expiration.
  void arm();
  void on_wake();
  void close();

  std::string path;
  std::function<void(const ExpiredTimer&)> on_expired;
  boost::asio::posix::stream_descriptor fifo;
  UniqueFd write_end;  ///< Our own writer: the FIFO never reads EOF between two clients.
  boost::asio::steady_timer wake;
  std::map<std::pair<pid_t, std::string>, Timer> timers;
  std::array<char, kMaxTimerRequestBytes> buffer;
  std::string partial;      ///< A line whose newline has not arrived yet.
  bool discarding = false;  ///< Skipping the rest of an over-long line.
  bool closed = false;
};

void FileTimerServer::Session::read_more() {
  fifo.async_read_some(boost::asio::buffer(buffer), [self = shared_from_this()](
                                                        boost::system::error_code ec, size_t n) {
    if (self->closed) return;
    if (ec) {
      spdlog::warn("stopped reading timer requests from {}: {}", self->path, ec.message());
      return;
    }
    self->consume({self->buffer.data(), n});
    self->read_more();
  });
}

void FileTimerServer::Session::consume(std::string_view chunk) {
  for (;;) {
    const size_t newline = chunk.find('\n');
    const std::string_view piece = chunk.substr(0, newline);
    if (!discarding && partial.size() + piece.size() > kMaxTimerRequestBytes) {
      spdlog::warn("ignoring a timer request in {} longer than {} bytes", path,
                   kMaxTimerRequestBytes);
      partial.clear();
      discarding = true;
    }
    if (!discarding) partial.append(piece);
    if (newline == std::string_view::npos) break;
    if (!discarding) on_request(partial);
    partial.clear();
    discarding = false;
    chunk.remove_prefix(newline + 1);
  }
  arm();
}

Expected<TimerRequest> parse_timer_request(std::string_view line) {
  if (line.find_first_not_of(" \t\r") == std::string_view::npos) return Error{};
  const auto request = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!request.is_object()) return Error{"not a JSON object"};
  auto field = [&](const char* name) -> const nlohmann::json* {
    auto it = request.find(name);
    return it == request.end() ? nullptr : &*it;
  };
  const nlohmann::json* version = field("version");
  if (version && !(version->is_number_integer() && *version == 1)) return Error{"unknown version"};
  const nlohmann::json *pid = field("pid"), *scope = field("scope_id"),
                       *expiration = field("expiration_time"), *signal = field("signal");
  // Checked before converting: a float pid or signal out of int's range would be undefined.
  if (!pid || !pid->is_number_integer() || *pid < 0 || *pid > std::numeric_limits<pid_t>::max())
    return Error{"\"pid\" must be a process id"};
  if (!scope || !scope->is_string()) return Error{"\"scope_id\" must be a string"};
  if (!expiration || !expiration->is_number()) return Error{"\"expiration_time\" must be a number"};
  if (signal && !(signal->is_number_integer() && *signal >= 0 && *signal < 128))
    return Error{"\"signal\" must be a signal number"};
  return TimerRequest{pid->get<pid_t>(), scope->get<std::string>(), expiration->get<double>(),
                      signal ? signal->get<int>() : 0};
}

void FileTimerServer::Session::on_request(std::string_view line) {
  auto parsed = parse_timer_request(line);
  if (!parsed) {
    if (!parsed.error().message.empty())
      spdlog::warn("ignoring a timer request in {} ({}): {}", path, parsed.error().message,
                   line.substr(0, kQuotedRequestBytes));
    return;
  }
  TimerRequest& request = *parsed;
  auto key = std::make_pair(request.pid, std::move(request.scope_id));
  if (request.expiration_time < 0)
    timers.erase(key);  // Negative: torch's release.
  else if (timers.size() < kMaxTimers || timers.contains(key))
    timers[std::move(key)] = {request.expiration_time, request.signal};
  else
    spdlog::warn("ignoring a timer request in {} (too many timers): {}", path,
                 line.substr(0, kQuotedRequestBytes));
}

void FileTimerServer::Session::arm() {
  if (timers.empty()) {
    wake.cancel();
    return;
  }
  double earliest = timers.begin()->second.expiration_time;
  for (const auto& entry : timers) earliest = std::min(earliest, entry.second.expiration_time);
  // Expirations are wall-clock times; on_wake re-checks them, so a clock step costs one re-arm.
  const double seconds = std::clamp(earliest - epoch_seconds_now(), 0.0,
                                    std::chrono::duration<double>(kLongestWake).count());
  const auto delay = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(seconds));
  wake.expires_after(delay);
  wake.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (!ec && !self->closed) self->on_wake();
  });
}

void FileTimerServer::Session::on_wake() {
  const double now = epoch_seconds_now();
  std::map<pid_t, ExpiredTimer> expired;
  for (const auto& [key, timer] : timers) {
    if (timer.expiration_time > now) continue;
    ExpiredTimer candidate{key.first, key.second, timer.expiration_time, timer.signal};
    auto [slot, inserted] = expired.try_emplace(key.first, candidate);
    if (!inserted && reported_before(candidate, slot->second)) slot->second = std::move(candidate);
  }
  std::erase_if(timers, [&](const auto& entry) { return expired.contains(entry.first.first); });
  arm();
  // Last: a listener may destroy the server, which leaves this session closed but alive (the
  // handler holds it).
  for (const auto& [pid, timer] : expired) {
    if (closed) break;
    on_expired(timer);
  }
}

void FileTimerServer::Session::close() {
  closed = true;
  timers.clear();
  wake.cancel();
  boost::system::error_code ignored;
  fifo.close(ignored);
  write_end.reset();
}

FileTimerServer::FileTimerServer(boost::asio::io_context& io, std::filesystem::path path,
                                 std::function<void(const ExpiredTimer&)> on_expired)
    : path_(std::move(path)) {
  auto fail = [this](const char* call, bool created) {
    const int error = errno;
    if (created) ::unlink(path_.c_str());
    throw std::system_error(error, std::generic_category(),
                            std::string(call) + "(" + path_.string() + ")");
  };
  struct stat existing;
  // A FIFO left by an earlier run (torch's server replaces it too); anything else is an error.
  if (::lstat(path_.c_str(), &existing) == 0 && S_ISFIFO(existing.st_mode)) ::unlink(path_.c_str());
  if (::mkfifo(path_.c_str(), 0600) != 0) fail("mkfifo", false);
  // Reader first: opening the writer non-blocking needs one.
  UniqueFd read_end(::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!read_end.valid()) fail("open", true);
  UniqueFd write_end(::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
  if (!write_end.valid()) fail("open", true);
  session_ = std::make_shared<Session>(io, path_.string(), std::move(on_expired),
                                       std::move(read_end), std::move(write_end));
  session_->read_more();
}

FileTimerServer::~FileTimerServer() {
  session_->close();
  ::unlink(path_.c_str());
}

void FileTimerServer::clear_pid(pid_t pid) {
  std::erase_if(session_->timers, [pid](const auto& entry) { return entry.first.first == pid; });
  session_->arm();
}

}  // namespace mcprun
