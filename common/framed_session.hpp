// One framed-JSON connection on the serving side (the daemon's agent sessions, the agent's
// helper channel): reads under a deadline, a bounded write queue, a message-rate cap, and no
// exception out of a handler. Whatever one peer sends costs that peer's connection at most.
#pragma once

#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <deque>
#include <memory>
#include <string>

namespace mcprun {

/// What one connection may cost its server.
struct SessionLimits {
  /// Bytes waiting to be written before the peer counts as not reading, and is closed.
  size_t max_queued_bytes = 4 * 1024 * 1024;
  /// Messages per second a peer may send on average, and in one burst. A real agent sends a
  /// heartbeat a second and a barrier arrival per rank: far below.
  double messages_per_second = 1000;
  double message_burst = 4000;
};

/// A framed-JSON connection; subclasses handle the messages.
class FramedSession : public std::enable_shared_from_this<FramedSession> {
 public:
  using Socket = boost::asio::generic::stream_protocol::socket;
  FramedSession(Socket socket, std::string peer, SessionLimits limits = {});
  virtual ~FramedSession() = default;
  FramedSession(const FramedSession&) = delete;
  FramedSession& operator=(const FramedSession&) = delete;

  /// Starts reading; a peer silent for `first_message` is closed (zero: no deadline).
  void start(std::chrono::milliseconds first_message);
  /// Queues one message; a peer that lets more than max_queued_bytes pile up is closed.
  void send(const nlohmann::json& message);
  /// Closes once everything queued is written.
  void close_after_write();
  void close();
  bool closed() const { return closed_; }
  /// "10.0.0.2:41234", "unix uid 1000", "rank 3's helper": who this is, for the log.
  const std::string& peer() const { return peer_; }

 protected:
  /// One whole frame; may throw, which closes this connection only. Runs on the io thread.
  virtual void on_frame(const nlohmann::json& message) = 0;
  /// The connection closed; called once.
  virtual void on_closed() = 0;
  /// Closes the connection if no message arrives within `limit` from now (zero: never).
  void expect_message_within(std::chrono::milliseconds limit);
  void set_peer(std::string peer) { peer_ = std::move(peer); }

 private:
  void read();
  void drain_frames();
  /// Whether the peer is within its message rate; takes one message's allowance.
  bool within_rate();
  void write_next();

  Socket socket_;
  boost::asio::steady_timer deadline_;
  std::string peer_;
  SessionLimits limits_;
  std::array<char, 8192> chunk_;
  std::string buffer_;
  std::deque<std::string> writes_;
  size_t queued_bytes_ = 0;
  double allowance_;  ///< Messages the peer may still send at once (token bucket).
  std::chrono::steady_clock::time_point allowance_at_;
  bool closed_ = false;
  bool close_after_write_ = false;
};

}  // namespace mcprun
