// One framed-JSON connection, served or dialled: the daemon's agent sessions, the agent's helper
// channel, the agent's rendezvous client and the operator commands. Reads under a deadline, the
// protocol's frame cap, a bounded write queue, a message-rate cap where the peer is a stranger,
// and no exception out of a handler. Whatever one peer sends costs that peer's connection at
// most. `connect_within` opens the dialled side under a deadline.
#pragma once

#include <array>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/endpoint.hpp"
#include "common/expected.hpp"
#include "common/protocol.hpp"

namespace mcprun {

/// How long opening a connection to a rendezvousd may take: a peer that never answers (its
/// SYNs dropped, its backlog full, its host gone) costs this, never a hang.
inline constexpr std::chrono::seconds kConnectTimeout{10};

/// What one connection may cost the program at its end.
struct SessionLimits {
  /// Bytes waiting to be written before the peer counts as not reading, and is closed.
  size_t max_queued_bytes = 4 * 1024 * 1024;
  /// Messages per second a peer may send on average, and in one burst; 0: not metered. A real
  /// agent sends a heartbeat a second and a barrier arrival per rank: far below.
  double messages_per_second = 1000;
  double message_burst = 4000;
};

/// The smallest write queue that still holds one frame of the largest size.
inline constexpr size_t kMinQueuedBytes = kFrameHeaderBytes + kMaxFrameBytes;

/// For a peer on this program's own side (a worker's helper, the rendezvousd an agent or an
/// operator dialled): the same frame and queue caps, no message-rate cap.
inline constexpr SessionLimits kUnmeteredLimits{.messages_per_second = 0, .message_burst = 0};

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
  void send(const nlohmann::json& message) { send_frame(encode_frame(message)); }
  /// Queues one encoded frame, as send() does.
  void send_frame(std::string frame);
  /// Whether queued frames are still being written.
  bool writing() const { return !writes_.empty(); }
  /// After a close: the frames queued and never begun, for a client that carries them to its
  /// next connection (the one being written when it broke may be cut, and is not among them).
  std::deque<std::string> take_unwritten();
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
  /// The peer broke a rule or a limit and is about to be closed: the log says why. A command
  /// that reports one line of its own keeps `reason` instead.
  virtual void on_cut(const std::string& reason);
  /// Closes the connection if no message arrives within `limit` from now (zero: never).
  void expect_message_within(std::chrono::milliseconds limit);
  void set_peer(std::string peer) { peer_ = std::move(peer); }

 private:
  /// Closes the connection for `reason` (on_cut hears it first).
  void cut(const std::string& reason);
  void read();
  void drain_frames();
  /// Whether the peer is within its message rate; takes one message's allowance.
  bool within_rate();
  void write_next();
  /// Waits until `at`, then cuts the connection unless a message came since.
  void arm_deadline(std::chrono::steady_clock::time_point at);

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
  std::chrono::milliseconds silence_limit_{0};      ///< expect_message_within's; zero: none.
  std::chrono::steady_clock::time_point heard_at_;  ///< When that limit last began.
  bool deadline_armed_ = false;                     ///< A wait on deadline_ is pending.
};

/// A connection dialled under a deadline, before a session takes it over.
struct DialledSocket {
  FramedSession::Socket socket;
  std::string local_address;  ///< The address this host reached the peer from; 127.0.0.1 on unix.
};

/// Connects to `endpoint` (TCP, or a unix socket on this host) within `limit`, running `io`
/// meanwhile. The error is a cause for the caller's line: "Connection refused", "no answer within
/// 10 s", "cannot resolve HOST: ...".
Expected<DialledSocket> connect_within(boost::asio::io_context& io, const Endpoint& endpoint,
                                       std::chrono::milliseconds limit);

}  // namespace mcprun
