// The typed messages of common/protocol.hpp's frames, each parsed at the boundary by one function
// that returns the message or a one-line reason naming the field ("join: field \"nproc\" must be
// an integer, not a string"). Past these functions no handler reads raw JSON, so a field of the
// wrong type costs its sender one refused message, never an exception in an I/O handler.
#pragma once

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/expected.hpp"

namespace mcprun {

/// A parsed message, or the one-line reason it was refused.
template <class Message>
using Parsed = Expected<Message>;

/// A round's limits when a join does not say (mcprun's --rdzv-conf defaults): torchrun's
/// join_timeout and last_call_timeout, but finite and short (torchrun: 600 and 30 s), so that a
/// missing node fails the launch in minutes rather than hanging it.
inline constexpr std::chrono::seconds kDefaultJoinTimeout{120};
inline constexpr std::chrono::seconds kDefaultLastCallTimeout{5};

// ---- agent -> daemon ----

/// A running node's share of its round, as the daemon assigned it ("assignment"), and as the
/// node repeats it in a "rejoin" after its connection broke.
struct AssignmentMessage {
  int group_rank = 0;
  int group_world_size = 0;
  int world_size = 0;
  int rank_offset = 0;
  std::string master_addr;
  int master_port = 0;
};

/// "join", or "rejoin" (which carries the node's live assignment too).
struct JoinMessage {
  std::string token;  ///< Empty when none was sent.
  std::string job, node;
  std::string addr;  ///< Empty: the daemon uses the peer's address.
  int nproc = 0;
  int node_rank = -1;  ///< -1: any slot.
  int master_port = 0;
  int gpu_count = 0;  ///< Of the "gpus" list, which is only logged.
  std::map<std::string, std::string> labels;
  int min_nodes = 0, max_nodes = 0;
  double join_timeout_s = kDefaultJoinTimeout.count();
  double last_call_timeout_s = kDefaultLastCallTimeout.count();
  int restart_count = 0;  ///< The agent's restarts so far: above 0, it re-joins after a failure.
  bool progress = true;   ///< The agent shows a forming round's progress (a terminal's redraws).
  std::optional<AssignmentMessage> assignment;  ///< Set for "rejoin" only.
};

/// GPUs a job already held before the daemon restarted, re-registered with its "lease".
struct HeldLease {
  std::vector<std::string> gpus;
  int port = 0;
};

/// "lease": a local job asks for GPUs and a master port.
struct LeaseRequest {
  int gpus = 0;
  double wait_s = 0;
  std::string job = "?";
  std::optional<HeldLease> held;
};

/// "jobs", "status" or "stop" from `mcprun jobs|status|stop`.
struct OperatorRequest {
  std::string type;
  std::string token;  ///< Empty when none was sent.
  std::string job;    ///< Empty for "jobs".
};

/// "barrier" from an agent: one of its ranks reached a helper barrier.
struct BarrierArrival {
  std::string name;
  int rank = -1;
};

/// "failed", both ways: a worker failed; every agent stops its group.
struct FailedNotice {
  std::string node;  ///< Set by the daemon when it relays; ignored from an agent.
  std::string reason = "a worker failed";
  int exit_code = 1;
};

/// "stall" or "stall_report", which the daemon relays without reading more than it logs: the
/// receiving agents parse the body (launcher/watch/stall_report.hpp) and cope with a bad one.
struct RelayedNotice {
  nlohmann::json body;  ///< The message as sent, an object whose checked fields have their types.
  std::string what;     ///< "stall": what stalled, for the daemon's log.
};

// ---- daemon -> agent ----

/// The heartbeat pace a daemon message may carry ("joined", "assignment", "lease", "pace").
struct PaceMessage {
  int heartbeat_interval_ms = 0;  ///< 0: the message carries none.
};

/// "progress": a forming round's state.
struct ProgressMessage {
  int joined = 0, min_nodes = 0, max_nodes = 0;
  std::vector<std::string> names;
  double remaining_s = 0;
};

/// "membership" or "lost": a node joins a running elastic job, or vanished.
struct NodeNotice {
  std::string node = "?";
};

/// "error" or "queued": one line for the user.
struct TextMessage {
  std::string message;
};

/// "barrier_done", to an agent and to a worker: every rank reached barrier `name`.
struct BarrierDone {
  std::string name;
};

/// "lease" from the daemon: granted.
struct LeaseGrant {
  std::vector<std::string> gpus;
  int port = 0;
};

// ---- worker -> agent (launcher/watch/agent_channel.hpp) ----

/// "hello": sent once per helper connection.
struct HelloMessage {
  int rank = -1;
  int pid = 0;
};

/// "barrier" from a worker: it blocks until the agent answers "barrier_done".
struct BarrierRequest {
  std::string name;
  double timeout_s = 0;
};

// ---- daemon -> operator ----

/// One job in the answer to "jobs" and "status".
struct JobSummary {
  std::string id, owner, state;
  int nodes = 0, ranks = 0;
  double age_s = 0;
};

/// One node of a job in the answer to "status".
struct JobMember {
  std::string node;
  bool connected = false, done = false;
};
struct JobPlacementLine {
  std::string node, addr, ranks;
  int group_rank = 0;
};

/// The answer to "status".
struct JobStatus {
  JobSummary summary;
  int min_nodes = 0, max_nodes = 0;
  std::string master;  ///< Empty until the round completed.
  std::vector<JobPlacementLine> placement;
  std::vector<JobMember> members;
};

Parsed<JoinMessage> parse_join(const nlohmann::json& message);
Parsed<JoinMessage> parse_rejoin(const nlohmann::json& message);
Parsed<LeaseRequest> parse_lease_request(const nlohmann::json& message);
Parsed<OperatorRequest> parse_operator_request(const nlohmann::json& message);
Parsed<BarrierArrival> parse_barrier_arrival(const nlohmann::json& message);
Parsed<FailedNotice> parse_failed(const nlohmann::json& message);
Parsed<RelayedNotice> parse_stall(const nlohmann::json& message);
Parsed<RelayedNotice> parse_stall_report(const nlohmann::json& message);
/// "straggler": the store host's straggler line, for every other node's console (`what`).
Parsed<RelayedNotice> parse_straggler(const nlohmann::json& message);

Parsed<PaceMessage> parse_pace(const nlohmann::json& message);
Parsed<AssignmentMessage> parse_assignment(const nlohmann::json& message);
Parsed<ProgressMessage> parse_progress(const nlohmann::json& message);
Parsed<NodeNotice> parse_node_notice(const nlohmann::json& message);
Parsed<TextMessage> parse_text(const nlohmann::json& message);
Parsed<BarrierDone> parse_barrier_done(const nlohmann::json& message);
Parsed<LeaseGrant> parse_lease_grant(const nlohmann::json& message);

Parsed<HelloMessage> parse_hello(const nlohmann::json& message);
Parsed<BarrierRequest> parse_barrier_request(const nlohmann::json& message);

Parsed<std::vector<JobSummary>> parse_jobs_reply(const nlohmann::json& message);
Parsed<JobStatus> parse_status_reply(const nlohmann::json& message);

/// The message type of a frame decode_frame accepted (it checked that "type" is a string).
std::string message_type(const nlohmann::json& message);

}  // namespace mcprun
