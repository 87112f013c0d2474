// One agent (or operator) connection to the rendezvous: framed reads under a deadline, queued
// writes. Shared by the server and its operator requests.
#pragma once

#include <sys/types.h>

#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <nlohmann/json.hpp>

#include <array>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "common/logging.hpp"
#include "common/protocol.hpp"
#include "rendezvousd/rendezvous_server.hpp"

namespace mcprun {

namespace asio = boost::asio;

/// One agent connection: framed reads under a deadline, queued writes.
class AgentSession : public std::enable_shared_from_this<AgentSession> {
 public:
  AgentSession(asio::generic::stream_protocol::socket socket, RendezvousServer& server,
               std::string peer, std::string peer_address, std::optional<uid_t> uid)
      : uid(uid),
        socket_(std::move(socket)),
        deadline_(socket_.get_executor()),
        server_(server),
        peer_(std::move(peer)),
        peer_address_(std::move(peer_address)) {}

  void start() {
    arm_deadline(server_.settings().first_message_timeout);
    read();
  }

  void send(const nlohmann::json& message) {
    if (closed_) return;
    const bool idle = writes_.empty();
    writes_.push_back(encode_frame(message));
    if (idle) write_next();
  }

  /// Sends a last error message, then closes once it is written.
  void refuse(const std::string& reason) {
    spdlog::warn("{}: {}", peer_, reason);
    reply_and_close({{"type", "error"}, {"message", reason}});
  }

  /// Sends a last message (an operator request's answer), then closes once it is written.
  void reply_and_close(const nlohmann::json& message) {
    send(message);
    close_after_write_ = true;
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ignored;
    deadline_.cancel();
    socket_.shutdown(asio::socket_base::shutdown_both, ignored);
    socket_.close(ignored);
    server_.on_closed(shared_from_this());
  }

  const std::string& peer_address() const { return peer_address_; }
  const std::optional<uid_t> uid;  ///< The peer's uid (SO_PEERCRED), on the unix socket only.
  std::string job_id, node;
  uint64_t lease_id = 0;  ///< The GPUs and port this connection holds; 0: none.
  uint64_t generation = 0;
  bool done = false;  ///< The node reported that its workers all succeeded.

 private:
  void arm_deadline(std::chrono::milliseconds limit) {
    deadline_.expires_after(limit);
    deadline_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec) return;  // Re-armed or cancelled.
      spdlog::warn("{}: silent for too long; closing", self->peer_);
      self->close();
    });
  }

  void read() {
    socket_.async_read_some(asio::buffer(chunk_), [self = shared_from_this()](
                                                      boost::system::error_code ec, size_t n) {
      if (ec) return self->close();
      self->buffer_.append(self->chunk_.data(), n);
      self->drain_frames();
      if (!self->closed_) self->read();
    });
  }

  void drain_frames() {
    while (!closed_) {
      FrameResult result = decode_frame(buffer_);
      if (std::holds_alternative<FrameIncomplete>(result)) return;
      if (auto* error = std::get_if<FrameError>(&result)) {
        spdlog::warn("{}: bad frame: {}; closing", peer_, error->message);
        return close();
      }
      Frame& frame = std::get<Frame>(result);
      buffer_.erase(0, frame.consumed);
      arm_deadline(server_.settings().lease);
      server_.on_message(shared_from_this(), frame.message);
    }
  }

  void write_next() {
    asio::async_write(socket_, asio::buffer(writes_.front()),
                      [self = shared_from_this()](boost::system::error_code ec, size_t) {
                        if (ec) return self->close();
                        self->writes_.pop_front();
                        if (!self->writes_.empty()) self->write_next();
                        else if (self->close_after_write_) self->close();
                      });
  }

  asio::generic::stream_protocol::socket socket_;
  asio::steady_timer deadline_;
  RendezvousServer& server_;
  std::string peer_, peer_address_;
  std::array<char, 8192> chunk_;
  std::string buffer_;
  std::deque<std::string> writes_;
  bool closed_ = false;
  bool close_after_write_ = false;
};

}  // namespace mcprun
