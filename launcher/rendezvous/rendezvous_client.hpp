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

/// This node's share of a completed round.
using Assignment = JobPlacement;

/// GPUs and a master port the local rendezvousd leased to this job, for as long as the client
/// stays connected.
struct GrantedLease {
  std::vector<std::string> gpus;  ///< PCI bus ids.
  int port = 0;
};

/// What another node told us: stop the group.
struct PeerStop {
  std::string reason;              ///< "node b: rank 3 exited with exit code 7", "node c lost", ...
  int exit_code = 0;               ///< The exit code this node should end with.
  bool membership_change = false;  ///< A node joins: re-form without spending a restart.
  nlohmann::json preflight = nullptr;  ///< The sender's preflight verdict when that is what failed.
};

/// What the other nodes say while the workers run; each handler is optional.
struct PeerEvents {
  std::function<void(const PeerStop&)> on_stop;         ///< At most once.
  std::function<void(const nlohmann::json&)> on_stall;  ///< A StallNotice, at most once.
  /// A node's ranks when it stalled: RankProgress objects (launcher/watch/stall_report.hpp).
  std::function<void(const std::string& node, const nlohmann::json& ranks)> on_stall_report;
  std::function<void(const std::string&)> on_barrier_done;  ///< Every rank reached it.
  std::function<void(const std::string&)> on_straggler;     ///< The store host's line, as sent.
};

/// One connection to rendezvousd (or the embedded server): "HOST:PORT", or "unix:PATH" for an
/// agent on the daemon's own host. Each connection is a FramedSession with kUnmeteredLimits: the
/// protocol's frame cap and the write-queue cap every connection has.
class RendezvousClient {
 public:
  RendezvousClient(boost::asio::io_context& io, std::string endpoint);
  /// Closes the connection; handlers still queued see that the client is gone.
  ~RendezvousClient();
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  /// Connects and sends `join` (from this connection's address unless it names one), then waits
  /// for the assignment up to `limit`. On failure: one line.
  Expected<Assignment> join(JoinMessage join, std::chrono::milliseconds limit);
  /// Connects and asks for GPUs and a port; waits up to `limit`.
  Expected<GrantedLease> lease(LeaseRequest request, std::chrono::milliseconds limit);
  /// Listens for the other nodes (heartbeats already run since the join was accepted).
  void watch(PeerEvents events);
  /// Sends a message: to every other node of the job a stall, stall report, straggler line or
  /// barrier arrival.
  void send(const AgentMessage& message);
  /// Tells every other node to stop; `exit_code` is what they should exit with, and
  /// `preflight` the check's verdict when it is what failed.
  void report_failure(const std::string& reason, int exit_code, nlohmann::json preflight = nullptr);
  /// Waits up to `limit` for the rendezvous to answer report_failure(), after which job_closed()
  /// says whether the job can restart.
  void await_failure_noted(std::chrono::milliseconds limit);
  /// Tells the rendezvous this node finished cleanly.
  void report_done();
  /// The local address of the connection: the one this node reaches the rendezvous from.
  std::string local_address() const;
  /// Why the job cannot restart, once the rendezvous said so (another node already finished):
  /// in answer to a join, or when the round ended.
  const std::optional<std::string>& job_closed() const { return job_closed_; }

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
