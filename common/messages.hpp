// The codec of common/protocol.hpp's frames: one struct per message type, encode() to put it on
// the wire and one parse function to take it off, side by side in messages.cpp. A receiver decodes
// a frame into the variant of what may reach it (decode_agent_message, ...) and dispatches on the
// type with std::visit, so a message nobody handles does not compile. A parse returns the message
// or a one-line reason naming the field ("join: field \"nproc\" must be an integer, not a
// string"): past the decoder no handler reads raw JSON, so a field of the wrong type costs its
// sender one refused message, never an exception in an I/O handler.
#pragma once

#include <chrono>
#include <cstdint>
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

/// "join", or "rejoin" when it carries the node's live assignment.
struct JoinMessage {
  std::string token;  ///< Empty when none was sent.
  std::string job, node;
  std::string addr;  ///< Empty: the daemon uses the peer's address.
  int nproc = 0;
  int node_rank = -1;  ///< -1: any slot.
  int master_port = 0;
  nlohmann::json gpus = nlohmann::json::array();  ///< Each pinned GPU's topology; only logged.
  std::map<std::string, std::string> labels;
  int min_nodes = 0, max_nodes = 0;
  double join_timeout_s = kDefaultJoinTimeout.count();
  double last_call_timeout_s = kDefaultLastCallTimeout.count();
  int restart_count = 0;  ///< The agent's restarts so far: above 0, it re-joins after a failure.
  bool progress = true;   ///< The agent shows a forming round's progress (a terminal's redraws).
  std::optional<AssignmentMessage> assignment;  ///< Set for "rejoin" only.
};

/// "heartbeat", from an agent or a worker: any message renews a lease; this one says no more.
struct HeartbeatMessage {};

/// "done": every worker of this node succeeded.
struct DoneMessage {};

/// "clock" from `mcprun doctor`: the daemon's wall clock, please.
struct ClockRequest {};

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
  /// The preflight's verdict when it is what failed (launcher/preflight/preflight_check.hpp's
  /// verdict_for_peers): a node stopped before its own ranks judged prints and records this one.
  nlohmann::json preflight = nullptr;
};

/// "stall", both ways, which the daemon relays without reading more than it logs: the receiving
/// agents parse the body (launcher/watch/stall_report.hpp) and cope with a bad one.
struct StallMessage {
  nlohmann::json body;  ///< The notice, an object whose checked fields have their types.
  std::string what;     ///< What stalled, for the daemon's log.
};

/// "stall_report", both ways: one node's ranks when a stall was declared.
struct StallReportMessage {
  std::string node;                                ///< Set by the daemon when it relays.
  nlohmann::json ranks = nlohmann::json::array();  ///< RankProgress objects, read by each agent.
};

/// "straggler", both ways: the store host's straggler or slow-collective line, for every console.
struct StragglerMessage {
  std::string node;  ///< Set by the daemon when it relays.
  std::string line;
};

// ---- daemon -> agent ----

/// The heartbeat pace a daemon message may carry ("joined", "assignment", "lease", "pace"), and
/// "pace" itself: heartbeat this often from now on.
struct PaceMessage {
  int heartbeat_interval_ms = 0;  ///< 0: the message carries none.
};

/// "joined": the join was accepted (its pace rides along).
struct JoinedMessage {};

/// "progress": a forming round's state.
struct ProgressMessage {
  int joined = 0, min_nodes = 0, max_nodes = 0;
  std::vector<std::string> names;
  double remaining_s = 0;
};

/// "membership": a node joins a running elastic job; re-join for a new round.
struct MembershipNotice {
  std::string node = "?";
};

/// "lost": a node's agent vanished or went silent past its lease.
struct LostNotice {
  std::string node = "?";
};

/// "error": the request was refused; one line for the user.
struct ErrorMessage {
  std::string message;
};

/// "closed": the job cannot restart (another node already finished); one line for the user.
struct ClosedNotice {
  std::string message;
};

/// "queued": a lease request waits; who holds the GPUs and who waits first.
struct QueuedNotice {
  std::string message;
};

/// "noted": the daemon heard this node's failure and told every node.
struct FailureNoted {};

/// "clock" from the daemon: its wall clock when it answered.
struct ClockReply {
  int64_t unix_time_ns = 0;
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

/// "jobs": the answer to "jobs".
struct JobsReply {
  std::vector<JobSummary> jobs;
};

/// "status": the answer to "status".
struct JobStatus {
  JobSummary summary;
  int generation = 0;  ///< The round's number in the daemon: a restart or re-forming changes it.
  int min_nodes = 0, max_nodes = 0;
  std::string master;  ///< Empty until the round completed.
  std::vector<JobPlacementLine> placement;
  std::vector<JobMember> members;
};

/// "stopped": the answer to "stop".
struct StoppedReply {
  std::string job;
};

// ---- what may reach each end ----

/// What an agent, or `mcprun jobs|status|stop|doctor`, sends the rendezvous.
using AgentMessage = std::variant<JoinMessage, HeartbeatMessage, DoneMessage, FailedNotice,
                                  StallMessage, StallReportMessage, StragglerMessage,
                                  BarrierArrival, ClockRequest, LeaseRequest, OperatorRequest>;
/// What the rendezvous sends an agent or an operator.
using RendezvousMessage =
    std::variant<JoinedMessage, AssignmentMessage, PaceMessage, ProgressMessage, MembershipNotice,
                 LostNotice, FailedNotice, ErrorMessage, ClosedNotice, FailureNoted, StallMessage,
                 StallReportMessage, StragglerMessage, BarrierDone, ClockReply, LeaseGrant,
                 QueuedNotice, JobsReply, JobStatus, StoppedReply>;
/// What a worker's helper sends its agent (launcher/watch/agent_channel.hpp).
using WorkerMessage = std::variant<HelloMessage, HeartbeatMessage, BarrierRequest>;

/// The message a frame holds, by its "type"; the error names an unknown type ("unknown message
/// type 'x'") or the bad field ("malformed join: field ...").
Parsed<AgentMessage> decode_agent_message(const nlohmann::json& message);
Parsed<RendezvousMessage> decode_rendezvous_message(const nlohmann::json& message);
Parsed<WorkerMessage> decode_worker_message(const nlohmann::json& message);

/// Handlers for std::visit over a decoded message: one lambda per type.
template <class... Handlers>
struct MessageHandlers : Handlers... {
  using Handlers::operator()...;
};
template <class... Handlers>
MessageHandlers(Handlers...) -> MessageHandlers<Handlers...>;  // clang 14 deduces no aggregate.

// ---- encoding: each message's frame object, "type" included ----

nlohmann::json encode(const JoinMessage& join);  ///< "rejoin" when it carries an assignment.
nlohmann::json encode(const HeartbeatMessage&);
nlohmann::json encode(const DoneMessage&);
nlohmann::json encode(const ClockRequest&);
nlohmann::json encode(const LeaseRequest& lease);
nlohmann::json encode(const OperatorRequest& request);
nlohmann::json encode(const BarrierArrival& arrival);
nlohmann::json encode(const FailedNotice& failed);
nlohmann::json encode(const StallMessage& stall);
nlohmann::json encode(const StallReportMessage& report);
nlohmann::json encode(const StragglerMessage& straggler);
nlohmann::json encode(const JoinedMessage&);
nlohmann::json encode(const PaceMessage& pace);
nlohmann::json encode(const AssignmentMessage& assignment);
nlohmann::json encode(const ProgressMessage& progress);
nlohmann::json encode(const MembershipNotice& notice);
nlohmann::json encode(const LostNotice& notice);
nlohmann::json encode(const ErrorMessage& error);
nlohmann::json encode(const ClosedNotice& closed);
nlohmann::json encode(const QueuedNotice& queued);
nlohmann::json encode(const FailureNoted&);
nlohmann::json encode(const BarrierDone& done);
nlohmann::json encode(const ClockReply& clock);
nlohmann::json encode(const LeaseGrant& grant);
nlohmann::json encode(const JobsReply& reply);
nlohmann::json encode(const JobStatus& status);
nlohmann::json encode(const StoppedReply& reply);
nlohmann::json encode(const HelloMessage& hello);
nlohmann::json encode(const BarrierRequest& request);
/// Any message of the variant, by its type.
nlohmann::json encode(const AgentMessage& message);

// ---- decoding one type: what the decoders above run, and what the tests and fuzzers call ----

Parsed<JoinMessage> parse_join(const nlohmann::json& message);
Parsed<JoinMessage> parse_rejoin(const nlohmann::json& message);
Parsed<LeaseRequest> parse_lease_request(const nlohmann::json& message);
Parsed<OperatorRequest> parse_operator_request(const nlohmann::json& message);
Parsed<BarrierArrival> parse_barrier_arrival(const nlohmann::json& message);
Parsed<FailedNotice> parse_failed(const nlohmann::json& message);
Parsed<StallMessage> parse_stall(const nlohmann::json& message);
Parsed<StallReportMessage> parse_stall_report(const nlohmann::json& message);
Parsed<StragglerMessage> parse_straggler(const nlohmann::json& message);

Parsed<PaceMessage> parse_pace(const nlohmann::json& message);
Parsed<AssignmentMessage> parse_assignment(const nlohmann::json& message);
Parsed<ProgressMessage> parse_progress(const nlohmann::json& message);
Parsed<MembershipNotice> parse_membership(const nlohmann::json& message);
Parsed<LostNotice> parse_lost(const nlohmann::json& message);
Parsed<ErrorMessage> parse_error(const nlohmann::json& message);
Parsed<ClosedNotice> parse_closed(const nlohmann::json& message);
Parsed<QueuedNotice> parse_queued(const nlohmann::json& message);
Parsed<BarrierDone> parse_barrier_done(const nlohmann::json& message);
Parsed<ClockReply> parse_clock_reply(const nlohmann::json& message);
Parsed<LeaseGrant> parse_lease_grant(const nlohmann::json& message);

Parsed<HelloMessage> parse_hello(const nlohmann::json& message);
Parsed<BarrierRequest> parse_barrier_request(const nlohmann::json& message);

Parsed<JobsReply> parse_jobs_reply(const nlohmann::json& message);
Parsed<JobStatus> parse_status_reply(const nlohmann::json& message);
Parsed<StoppedReply> parse_stopped_reply(const nlohmann::json& message);

/// The message type of a frame decode_frame accepted (it checked that "type" is a string).
std::string message_type(const nlohmann::json& message);

}  // namespace mcprun
