// The agent's side of the rendezvous: join, wait for the assignment, then heartbeat and hear
// about the other nodes (a failed worker, a lost node) while the workers run.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/expected.hpp"
#include "common/framed_session.hpp"
#include "common/messages.hpp"
#include "launcher/plan/rank_plan.hpp"
#include "launcher/rendezvous/rendezvous_backend.hpp"
#include "rendezvous/rendezvous_round.hpp"

namespace mcprun {

/// Heartbeat period until the daemon names its own (a third of its lease) in "joined".
inline constexpr std::chrono::milliseconds kDefaultHeartbeatInterval{3000};
/// How long a running job's agent keeps trying to reach a restarted rendezvousd before it gives
/// the job up; its workers run on meanwhile.
inline constexpr std::chrono::seconds kReconnectTimeout{60};
/// Reconnect attempts start this far apart and double up to kReconnectBackoffMax.
inline constexpr std::chrono::milliseconds kReconnectBackoffStart{100};
inline constexpr std::chrono::milliseconds kReconnectBackoffMax{1000};
/// How long a failure or "done" report may take to leave: long enough for a live daemon, short
/// enough that a dead one does not hold up this node's exit.
inline constexpr std::chrono::seconds kReportFlushTimeout{2};

/// GPUs and a master port the local rendezvousd leased to this job, for as long as the client
/// stays connected.
struct GrantedLease {
  std::vector<std::string> gpus;  ///< PCI bus ids.
  int port = 0;
};

/// The rendezvous through rendezvousd's protocol: one connection to rendezvousd (or the embedded
/// server), "HOST:PORT", or "unix:PATH" for an agent on the daemon's own host. Each connection is
/// a FramedSession with kUnmeteredLimits: the protocol's frame cap and the write-queue cap every
/// connection has.
class RendezvousClient final : public RendezvousBackend {
 public:
  RendezvousClient(boost::asio::io_context& io, std::string endpoint);
  /// Closes the connection; handlers still queued see that the client is gone.
  ~RendezvousClient();
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  /// RendezvousBackend, over the connection: join connects and sends `join` (from the
  /// connection's address unless it names one); heartbeats run from then on.
  Expected<Assignment> join(JoinMessage join, std::chrono::milliseconds limit) override;
  void watch(PeerEvents events) override;
  void send(const AgentMessage& message) override;
  void report_failure(const std::string& reason, int exit_code,
                      nlohmann::json preflight = nullptr) override;
  void await_failure_noted(std::chrono::milliseconds limit) override;
  void report_done() override;
  std::string local_address() const override;
  const std::optional<std::string>& job_closed() const override { return job_closed_; }

  /// Connects and asks the box's rendezvousd for GPUs and a port; waits up to `limit`.
  Expected<GrantedLease> lease(LeaseRequest request, std::chrono::milliseconds limit);

 private:
  class Connection;
  /// A frame from the rendezvous, decoded, or why it could not be.
  using Incoming = Parsed<RendezvousMessage>;

  /// Connects over TCP or the unix socket within kConnectTimeout; an error line on failure.
  Expected<void> connect();
  /// The connection broke: before the assignment that is the end; after it, reconnect and
  /// re-register this node's live assignment, so a daemon restart costs the job nothing.
  void connection_lost();
  void try_reconnect(std::chrono::milliseconds backoff);
  /// Keeps a frame while reconnecting, within the same cap as a connection's write queue.
  void hold(std::string frame);
  /// Starts the heartbeat loop once.
  void heartbeat();
  void beat();
  /// Waits a heartbeat interval, then beats.
  void arm_heartbeat();
  /// Heartbeats at the pace a daemon message carries, if it carries one.
  void take_pace(const nlohmann::json& message);
  void flush(std::chrono::milliseconds limit);
  /// Hands watch()'s handler what arrived in the same read as the assignment, on the next turn
  /// of the loop, as if it had arrived then.
  void replay_early_messages();
  /// Logs a message from the rendezvous that failed to parse; the connection goes on.
  void ignore_malformed(const std::string& reason) const;

  boost::asio::io_context& io_;
  std::string endpoint_;
  std::shared_ptr<Connection> connection_;  ///< TCP, or a unix socket ("unix:PATH").
  std::string local_address_;
  boost::asio::steady_timer heartbeat_timer_;
  std::deque<std::string> held_;  ///< Frames sent while reconnecting, for the next connection.
  size_t held_bytes_ = 0;
  JoinMessage join_;                      ///< As sent; a rejoin repeats it with the assignment.
  std::optional<Assignment> assignment_;  ///< Set once the round completed.
  std::optional<LeaseRequest> lease_;     ///< A granted lease, re-registered after a reconnect.
  bool reconnecting_ = false;
  Clock::time_point reconnect_deadline_;
  boost::asio::steady_timer reconnect_timer_;
  std::function<void(Incoming)> on_message_;
  std::vector<RendezvousMessage> early_;  ///< Arrived after the assignment, before watch().
  bool closed_ = false;
  std::optional<std::string> job_closed_;
  bool failure_reported_ = false, failure_noted_ = false;
  bool heartbeating_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  ///< False once destroyed.
  std::chrono::milliseconds heartbeat_interval_ = kDefaultHeartbeatInterval;
};

}  // namespace mcprun
