// Each message's encoding, the inverse of its parse in messages.cpp: what a receiver's decoder
// reads back field for field (tests/messages_test.cpp round-trips every example).
#include "common/messages.hpp"

namespace mcprun {
namespace {

using json = nlohmann::json;

json typed(const char* type) { return {{"type", type}}; }

json assignment_fields(const AssignmentMessage& assignment) {
  return {
      {"group_rank", assignment.group_rank},   {"group_world_size", assignment.group_world_size},
      {"world_size", assignment.world_size},   {"rank_offset", assignment.rank_offset},
      {"master_addr", assignment.master_addr}, {"master_port", assignment.master_port}};
}

json summary_fields(const JobSummary& job) {
  return {{"id", job.id},       {"owner", job.owner}, {"nodes", job.nodes},
          {"ranks", job.ranks}, {"state", job.state}, {"age_s", job.age_s}};
}

/// Adds "node" where the daemon set it: a sender's own node is the connection's, not a field.
void add_node(json& message, const std::string& node) {
  if (!node.empty()) message["node"] = node;
}

}  // namespace

json encode(const JoinMessage& join) {
  json message = typed(join.assignment ? "rejoin" : "join");
  message.update({{"job", join.job},
                  {"node", join.node},
                  {"nproc", join.nproc},
                  {"node_rank", join.node_rank},
                  {"master_port", join.master_port},
                  {"labels", join.labels},
                  {"gpus", join.gpus},
                  {"min_nodes", join.min_nodes},
                  {"max_nodes", join.max_nodes},
                  {"join_timeout_s", join.join_timeout_s},
                  {"last_call_timeout_s", join.last_call_timeout_s},
                  {"restart_count", join.restart_count},
                  {"progress", join.progress}});
  if (!join.token.empty()) message["token"] = join.token;
  if (!join.addr.empty()) message["addr"] = join.addr;
  if (join.assignment) message["assignment"] = assignment_fields(*join.assignment);
  return message;
}

json encode(const HeartbeatMessage&) { return typed("heartbeat"); }
json encode(const DoneMessage&) { return typed("done"); }
json encode(const ClockRequest&) { return typed("clock"); }

json encode(const LeaseRequest& lease) {
  json message = typed("lease");
  message.update({{"gpus", lease.gpus}, {"wait_s", lease.wait_s}, {"job", lease.job}});
  if (lease.held)
    message.update({{"held_gpus", lease.held->gpus}, {"held_port", lease.held->port}});
  return message;
}

json encode(const OperatorRequest& request) {
  json message = typed(request.type.c_str());
  if (!request.job.empty()) message["job"] = request.job;
  if (!request.token.empty()) message["token"] = request.token;
  return message;
}

json encode(const BarrierArrival& arrival) {
  json message = typed("barrier");
  message.update({{"name", arrival.name}, {"rank", arrival.rank}});
  return message;
}

json encode(const FailedNotice& failed) {
  json message = typed("failed");
  message.update({{"reason", failed.reason}, {"exit_code", failed.exit_code}});
  if (!failed.preflight.is_null()) message["preflight"] = failed.preflight;
  add_node(message, failed.node);
  return message;
}

json encode(const StallMessage& stall) {
  json message = stall.body;
  message["type"] = "stall";
  return message;
}

json encode(const StallReportMessage& report) {
  json message = typed("stall_report");
  message["ranks"] = report.ranks;
  add_node(message, report.node);
  return message;
}

json encode(const StragglerMessage& straggler) {
  json message = typed("straggler");
  message["line"] = straggler.line;
  add_node(message, straggler.node);
  return message;
}

json encode(const JoinedMessage&) { return typed("joined"); }

json encode(const PaceMessage& pace) {
  json message = typed("pace");
  if (pace.heartbeat_interval_ms > 0) message["heartbeat_interval_ms"] = pace.heartbeat_interval_ms;
  return message;
}

json encode(const AssignmentMessage& assignment) {
  json message = typed("assignment");
  message.update(assignment_fields(assignment));
  return message;
}

json encode(const ProgressMessage& progress) {
  json message = typed("progress");
  message.update({{"joined", progress.joined},
                  {"min_nodes", progress.min_nodes},
                  {"max_nodes", progress.max_nodes},
                  {"names", progress.names},
                  {"remaining_s", progress.remaining_s}});
  return message;
}

json encode(const MembershipNotice& notice) {
  return {{"type", "membership"}, {"node", notice.node}};
}
json encode(const LostNotice& notice) { return {{"type", "lost"}, {"node", notice.node}}; }
json encode(const ErrorMessage& error) { return {{"type", "error"}, {"message", error.message}}; }
json encode(const ClosedNotice& closed) {
  return {{"type", "closed"}, {"message", closed.message}};
}
json encode(const QueuedNotice& queued) {
  return {{"type", "queued"}, {"message", queued.message}};
}
json encode(const FailureNoted&) { return typed("noted"); }
json encode(const BarrierDone& done) { return {{"type", "barrier_done"}, {"name", done.name}}; }
json encode(const ClockReply& clock) {
  return {{"type", "clock"}, {"unix_time_ns", clock.unix_time_ns}};
}
json encode(const LeaseGrant& grant) {
  return {{"type", "lease"}, {"gpus", grant.gpus}, {"port", grant.port}};
}

json encode(const JobsReply& reply) {
  json jobs = json::array();
  for (const JobSummary& job : reply.jobs) jobs.push_back(summary_fields(job));
  return {{"type", "jobs"}, {"jobs", jobs}};
}

json encode(const JobStatus& status) {
  json job = summary_fields(status.summary);
  job.update({{"generation", status.generation},
              {"min_nodes", status.min_nodes},
              {"max_nodes", status.max_nodes}});
  json members = json::array();
  for (const JobMember& member : status.members)
    members.push_back(
        {{"node", member.node}, {"connected", member.connected}, {"done", member.done}});
  job["members"] = members;
  if (!status.master.empty()) {
    job["master"] = status.master;
    json placement = json::array();
    for (const JobPlacementLine& line : status.placement)
      placement.push_back({{"node", line.node},
                           {"addr", line.addr},
                           {"group_rank", line.group_rank},
                           {"ranks", line.ranks}});
    job["placement"] = placement;
  }
  return {{"type", "status"}, {"job", job}};
}

json encode(const StoppedReply& reply) { return {{"type", "stopped"}, {"job", reply.job}}; }

json encode(const HelloMessage& hello) {
  return {{"type", "hello"}, {"rank", hello.rank}, {"pid", hello.pid}};
}

json encode(const BarrierRequest& request) {
  return {{"type", "barrier"}, {"name", request.name}, {"timeout_s", request.timeout_s}};
}

json encode(const AgentMessage& message) {
  return std::visit([](const auto& typed_message) { return encode(typed_message); }, message);
}

}  // namespace mcprun
