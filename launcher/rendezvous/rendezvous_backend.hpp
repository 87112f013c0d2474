// The seam between a launch and the rendezvous that forms its job: rendezvousd's protocol (a
// daemon, or the agent that hosts the round) or another backend behind the same calls. A launch
// joins, hears the other nodes while its workers run and tells them how it ended; which backend
// carries that is chosen once, from --rdzv-backend.
#pragma once

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/expected.hpp"
#include "common/messages.hpp"
#include "launcher/plan/rank_plan.hpp"

namespace mcprun {

/// This node's share of a completed round.
using Assignment = JobPlacement;

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

/// One node's place in a rendezvous, for one round: join it, then hear and tell the other nodes.
class RendezvousBackend {
 public:
  virtual ~RendezvousBackend() = default;

  /// Joins with `join` and waits up to `limit` for this node's share of the completed round. On
  /// failure: one line.
  virtual Expected<Assignment> join(JoinMessage join, std::chrono::milliseconds limit) = 0;
  /// Listens for the other nodes while the workers run.
  virtual void watch(PeerEvents events) = 0;
  /// Sends every other node of the job a stall, stall report, straggler line or barrier arrival.
  virtual void send(const AgentMessage& message) = 0;
  /// Tells every other node to stop; `exit_code` is what they should exit with, and `preflight`
  /// the check's verdict when it is what failed.
  virtual void report_failure(const std::string& reason, int exit_code,
                              nlohmann::json preflight = nullptr) = 0;
  /// Waits up to `limit` for the rendezvous to take report_failure() in, after which job_closed()
  /// says whether the job can restart.
  virtual void await_failure_noted(std::chrono::milliseconds limit) = 0;
  /// Tells the other nodes this node finished cleanly.
  virtual void report_done() = 0;
  /// The local address this node reaches the rendezvous from: the interface its ranks use.
  virtual std::string local_address() const = 0;
  /// Why the job cannot restart (another node already finished), once the rendezvous said so.
  virtual const std::optional<std::string>& job_closed() const = 0;
};

}  // namespace mcprun
