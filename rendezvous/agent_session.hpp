// One agent (or operator) connection to the rendezvous: common/framed_session.hpp's framing,
// deadlines and limits, plus what the server knows of the peer. Shared by the server and its
// operator requests; below the server, which it reaches through SessionHost.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/framed_session.hpp"
#include "common/logging.hpp"
#include "common/messages.hpp"
#include "rendezvous/server_settings.hpp"

namespace mcprun {

class AgentSession;

/// What a session reports to the server that accepted it. The server implements it, so that a
/// session knows nothing of the server but this.
class SessionHost {
 public:
  virtual const ServerSettings& settings() const = 0;
  virtual void on_message(const std::shared_ptr<AgentSession>& session,
                          const nlohmann::json& message) = 0;
  virtual void on_closed(const std::shared_ptr<AgentSession>& session) = 0;

 protected:
  ~SessionHost() = default;
};

/// One agent connection: the server reads its messages, and keeps its job and lease here.
class AgentSession : public FramedSession {
 public:
  AgentSession(Socket socket, SessionHost& server, std::string peer, std::string peer_address,
               std::optional<uid_t> uid)
      : FramedSession(std::move(socket), std::move(peer), server.settings().session_limits),
        uid(uid),
        server_(server),
        peer_address_(std::move(peer_address)) {}

  void start() { FramedSession::start(server_.settings().first_message_timeout); }

  /// Sends a last error message, then closes once it is written.
  void refuse(const std::string& reason) {
    spdlog::warn("{}: {}", peer(), reason);
    reply_and_close(encode(ErrorMessage{reason}));
  }

  /// Sends a last message (an operator request's answer), then closes once it is written.
  void reply_and_close(const nlohmann::json& message) {
    send(message);
    close_after_write();
  }

  std::shared_ptr<AgentSession> self() {
    return std::static_pointer_cast<AgentSession>(shared_from_this());
  }

  const std::string& peer_address() const { return peer_address_; }
  const std::optional<uid_t> uid;  ///< The peer's uid (SO_PEERCRED), on the unix socket only.
  std::string job_id, node;
  uint64_t lease_id = 0;  ///< The GPUs and port this connection holds; 0: none.
  uint64_t generation = 0;
  bool done = false;           ///< The node reported that its workers all succeeded.
  bool shows_progress = true;  ///< Its join asked for a forming round's progress.

  /// Paces the agent's heartbeats, never faster than before (one may be due at the old pace),
  /// and lets it be silent for three of them from now on; the interval to tell it.
  std::chrono::milliseconds pace(std::chrono::milliseconds interval) {
    heartbeat_interval_ = std::max(heartbeat_interval_, interval);
    renew_lease();
    return heartbeat_interval_;
  }
  std::chrono::milliseconds heartbeat_interval() const { return heartbeat_interval_; }

 private:
  void on_frame(const nlohmann::json& message) override {
    renew_lease();  // Any message does.
    server_.on_message(self(), message);
  }
  void renew_lease() {
    expect_message_within(std::max(server_.settings().lease, 3 * heartbeat_interval_));
  }
  void on_closed() override { server_.on_closed(self()); }

  SessionHost& server_;
  std::string peer_address_;
  std::chrono::milliseconds heartbeat_interval_{0};  ///< As last told; zero: none yet.
};

}  // namespace mcprun
