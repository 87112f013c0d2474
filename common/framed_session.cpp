#include "common/framed_session.hpp"

#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cstring>
#include <exception>
#include <optional>

#include "common/event_loop.hpp"
#include "common/logging.hpp"
#include "common/messages.hpp"

namespace mcprun {

namespace asio = boost::asio;

FramedSession::FramedSession(Socket socket, std::string peer, SessionLimits limits)
    : socket_(std::move(socket)),
      deadline_(socket_.get_executor()),
      peer_(std::move(peer)),
      limits_(limits),
      allowance_(limits.message_burst),
      allowance_at_(std::chrono::steady_clock::now()) {}

void FramedSession::start(std::chrono::milliseconds first_message) {
  expect_message_within(first_message);
  read();
}

void FramedSession::expect_message_within(std::chrono::milliseconds limit) {
  if (closed_) return;
  silence_limit_ = limit;
  heard_at_ = std::chrono::steady_clock::now();
  if (limit.count() <= 0) {
    deadline_armed_ = false;
    deadline_.cancel();
    return;
  }
  // A timer that fires no later than the new deadline is left alone: it looks again when it
  // fires. Re-arming it on every message cost an idle agent's heartbeat a cancelled handler and
  // two timer-queue updates, most of rendezvousd's CPU for 16,384 idle agents.
  if (deadline_armed_ && deadline_.expiry() <= heard_at_ + limit) return;
  arm_deadline(heard_at_ + limit);
}

void FramedSession::arm_deadline(std::chrono::steady_clock::time_point at) {
  deadline_armed_ = true;
  deadline_.expires_at(at);  // Cancels a wait already armed: its handler sees the abort.
  deadline_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec || self->closed_) return;  // Re-armed or cancelled.
    self->deadline_armed_ = false;
    const auto due = self->heard_at_ + self->silence_limit_;
    if (self->silence_limit_.count() <= 0) return;
    if (due > std::chrono::steady_clock::now()) return self->arm_deadline(due);  // Heard since.
    self->cut("silent for too long");
  });
}

void FramedSession::send_frame(std::string frame) {
  if (closed_) return;
  if (queued_bytes_ + frame.size() > limits_.max_queued_bytes)
    return cut(std::to_string(queued_bytes_) +
               " bytes wait to be written and the peer reads none of them");
  queued_bytes_ += frame.size();
  const bool idle = writes_.empty();
  writes_.push_back(std::move(frame));
  if (idle) write_next();
}

std::deque<std::string> FramedSession::take_unwritten() {
  std::deque<std::string> unwritten = std::exchange(writes_, {});
  if (!unwritten.empty()) unwritten.pop_front();  // Begun: the peer may hold part of it.
  queued_bytes_ = 0;
  return unwritten;
}

void FramedSession::on_cut(const std::string& reason) {
  spdlog::warn("{}: {}; closing", peer_, reason);
}

void FramedSession::cut(const std::string& reason) {
  if (closed_) return;
  try {
    on_cut(reason);
  } catch (const std::exception& error) {
    spdlog::error("{}: {}", peer_, error.what());
  }
  close();
}

void FramedSession::close_after_write() {
  close_after_write_ = true;
  if (writes_.empty()) close();
}

void FramedSession::close() {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  deadline_.cancel();
  socket_.shutdown(asio::socket_base::shutdown_both, ignored);
  socket_.close(ignored);  // A write in flight ends with operation_aborted; its buffer stays.
  try {
    on_closed();
  } catch (const std::exception& error) {
    spdlog::error("{}: closing the connection failed: {}", peer_, error.what());
  }
}

void FramedSession::read() {
  socket_.async_read_some(asio::buffer(chunk_),
                          [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                            if (self->closed_) return;
                            if (ec) return self->close();
                            self->buffer_.append(self->chunk_.data(), n);
                            self->drain_frames();
                            if (!self->closed_ && !self->close_after_write_) self->read();
                          });
}

bool FramedSession::within_rate() {
  if (limits_.messages_per_second <= 0) return true;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - allowance_at_).count();
  allowance_at_ = now;
  allowance_ = std::min(limits_.message_burst, allowance_ + elapsed * limits_.messages_per_second);
  if (allowance_ < 1) return false;
  allowance_ -= 1;
  return true;
}

void FramedSession::drain_frames() {
  // After a refusal or a last answer nothing more is read: the connection is ending.
  while (!closed_ && !close_after_write_) {
    FrameResult result = decode_frame(buffer_);
    if (std::holds_alternative<FrameIncomplete>(result)) return;
    if (auto* error = std::get_if<FrameError>(&result)) return cut("bad frame: " + error->message);
    Frame& frame = std::get<Frame>(result);
    buffer_.erase(0, frame.consumed);
    if (!within_rate())
      return cut(fmt::format("more than {:g} messages a second", limits_.messages_per_second));
    // The one place a peer's message enters a handler: nothing it causes leaves this frame.
    try {
      on_frame(frame.message);
    } catch (const std::exception& error) {
      return cut(fmt::format("'{}' message could not be handled: {}", message_type(frame.message),
                             error.what()));
    }
  }
}

void FramedSession::write_next() {
  asio::async_write(socket_, asio::buffer(writes_.front()),
                    [self = shared_from_this()](boost::system::error_code ec, size_t) {
                      if (self->closed_) return;
                      if (ec) return self->close();
                      self->queued_bytes_ -= self->writes_.front().size();
                      self->writes_.pop_front();
                      if (!self->writes_.empty())
                        self->write_next();
                      else if (self->close_after_write_)
                        self->close();
                    });
}

namespace {

/// How long a TCP connect given up on may take to report its cancellation before it is left.
constexpr std::chrono::seconds kCancelledConnectTimeout{1};
/// How often a unix socket whose listener's backlog is full is tried again.
constexpr std::chrono::milliseconds kUnixRetryInterval{20};

std::string seconds_text(std::chrono::milliseconds limit) {
  return fmt::format("{:g} s", std::chrono::duration<double>(limit).count());
}

/// Asio would report a unix connect that found the backlog full (EAGAIN) as done, the socket
/// unconnected: so this one tries the plain call again until the deadline.
Expected<DialledSocket> connect_unix(asio::io_context& io, const std::string& path,
                                     std::chrono::milliseconds limit) {
  sockaddr_un address{};
  if (path.size() >= sizeof address.sun_path) return Error{"socket path too long"};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  asio::local::stream_protocol::socket socket(io);
  boost::system::error_code ec;
  socket.open(asio::local::stream_protocol(), ec);
  if (!ec) socket.native_non_blocking(true, ec);
  if (ec) return Error{"socket: " + ec.message()};
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (::connect(socket.native_handle(), reinterpret_cast<const sockaddr*>(&address),
                   sizeof address) != 0) {
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return Error{std::strerror(errno)};
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= left.zero())
      return Error{"no answer within " + seconds_text(limit) +
                   ": its backlog is full and it accepts nothing"};
    run_until(
        io, [] { return false; },
        std::min<std::chrono::steady_clock::duration>(kUnixRetryInterval, left));
  }
  return DialledSocket{FramedSession::Socket(std::move(socket)), "127.0.0.1"};
}

}  // namespace

Expected<DialledSocket> connect_within(asio::io_context& io, const Endpoint& endpoint,
                                       std::chrono::milliseconds limit) {
  if (endpoint.is_unix()) return connect_unix(io, endpoint.unix_path, limit);
  using tcp = asio::ip::tcp;
  boost::system::error_code ec;
  tcp::resolver resolver(io);
  auto addresses = resolver.resolve(endpoint.host, std::to_string(endpoint.port), ec);
  if (ec) return Error{"cannot resolve " + endpoint.host + ": " + ec.message()};
  tcp::socket socket(io);
  // Shared with the handler, which may run after this frame is gone.
  auto connected = std::make_shared<std::optional<boost::system::error_code>>();
  asio::async_connect(
      socket, addresses,
      [connected](boost::system::error_code result, const tcp::endpoint&) { *connected = result; });
  if (!run_until(
          io, [&] { return connected->has_value(); }, limit)) {
    socket.close(ec);
    run_until(
        io, [&] { return connected->has_value(); }, kCancelledConnectTimeout);
    return Error{"no answer within " + seconds_text(limit)};
  }
  if (**connected) return Error{(*connected)->message()};
  std::string local_address = socket.local_endpoint(ec).address().to_string();
  return DialledSocket{FramedSession::Socket(std::move(socket)), std::move(local_address)};
}

}  // namespace mcprun
