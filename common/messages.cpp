#include "common/messages.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>

namespace mcprun {
namespace {

using json = nlohmann::json;

/// The longest a message's timeouts may be: about 115 days, beyond any a user would set, small
/// enough that converting it to milliseconds cannot overflow.
constexpr double kMaxSeconds = 1e7;
/// Ports, ranks and counts fit here; a larger number is a hostile or broken peer.
constexpr int kMaxCount = 1 << 24;
// A straggler line is under 400 bytes; the bound keeps a peer's from flooding every console.
constexpr size_t kMaxStragglerLine = 2048;

const char* kind_of(const json& value) {
  switch (value.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number with a fraction";
    default:
      return "binary";
  }
}

/// Reads typed fields out of one message object; the first bad field becomes the error.
class Fields {
 public:
  Fields(const json& object, std::string what) : object_(object), what_(std::move(what)) {
    if (!object_.is_object()) error_ = what_ + ": expected an object, not " + kind_of(object_);
  }

  template <class T>
  Fields& required(const char* name, T& out) {
    return read(name, out, /*required=*/true);
  }
  template <class T>
  Fields& optional(const char* name, T& out) {
    return read(name, out, /*required=*/false);
  }
  /// An integer field within [low, high].
  Fields& number(const char* name, int& out, bool required, int low, int high) {
    read(name, out, required);
    if (!error_ && (out < low || out > high))
      fail(name, fmt::format("must be between {} and {}, not {}", low, high, out));
    return *this;
  }
  /// A number field within [low, high].
  Fields& number(const char* name, double& out, bool required, double low, double high) {
    read(name, out, required);
    if (!error_ && (out < low || out > high))
      fail(name, fmt::format("must be between {:g} and {:g}, not {:g}", low, high, out));
    return *this;
  }
  /// The field itself, of any JSON type but null; nullptr when absent (or after an error).
  const json* raw(const char* name, bool required) {
    if (error_) return nullptr;
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) {
      if (required) fail(name, "is missing");
      return nullptr;
    }
    return &*it;
  }
  bool has(const char* name) const {
    if (error_) return false;
    auto it = object_.find(name);
    return it != object_.end() && !it->is_null();
  }
  void fail(const char* name, const std::string& problem) {
    if (!error_) error_ = fmt::format("{}: field \"{}\" {}", what_, name, problem);
  }
  const std::optional<std::string>& error() const { return error_; }
  const std::string& what() const { return what_; }

  /// The parsed message, or the first error.
  template <class Message>
  Parsed<Message> result(Message message) const {
    if (error_) return Error{*error_};
    return message;
  }

 private:
  template <class T>
  Fields& read(const char* name, T& out, bool required) {
    if (error_) return *this;
    auto it = object_.find(name);
    // A null counts as absent: an optional field keeps its default, a required one is missing.
    if (it == object_.end() || it->is_null()) {
      if (required) fail(name, "is missing");
      return *this;
    }
    if (!convert(*it, out))
      fail(name, fmt::format("must be {}, not {}", expected(out), kind_of(*it)));
    return *this;
  }

  static const char* expected(const std::string&) { return "a string"; }
  static const char* expected(const int&) { return "an integer"; }
  static const char* expected(const double&) { return "a number"; }
  static const char* expected(const bool&) { return "a boolean"; }
  static const char* expected(const std::vector<std::string>&) { return "an array of strings"; }
  static const char* expected(const std::map<std::string, std::string>&) {
    return "an object of strings";
  }

  static bool convert(const json& value, std::string& out) {
    if (!value.is_string()) return false;
    out = value.get_ref<const std::string&>();
    return true;
  }
  static bool convert(const json& value, int& out) {
    if (value.is_number_unsigned()) {
      const auto number = value.get<uint64_t>();
      if (number > static_cast<uint64_t>(std::numeric_limits<int>::max())) return false;
      out = static_cast<int>(number);
      return true;
    }
    if (!value.is_number_integer()) return false;
    const auto number = value.get<int64_t>();
    if (number < std::numeric_limits<int>::min() || number > std::numeric_limits<int>::max())
      return false;
    out = static_cast<int>(number);
    return true;
  }
  static bool convert(const json& value, double& out) {
    if (!value.is_number()) return false;
    out = value.get<double>();
    return std::isfinite(out);
  }
  static bool convert(const json& value, bool& out) {
    if (!value.is_boolean()) return false;
    out = value.get<bool>();
    return true;
  }
  static bool convert(const json& value, std::vector<std::string>& out) {
    if (!value.is_array()) return false;
    std::vector<std::string> strings;
    for (const json& item : value) {
      if (!item.is_string()) return false;
      strings.push_back(item.get_ref<const std::string&>());
    }
    out = std::move(strings);
    return true;
  }
  static bool convert(const json& value, std::map<std::string, std::string>& out) {
    if (!value.is_object()) return false;
    std::map<std::string, std::string> strings;
    for (const auto& [key, item] : value.items()) {
      if (!item.is_string()) return false;
      strings[key] = item.get_ref<const std::string&>();
    }
    out = std::move(strings);
    return true;
  }

  const json& object_;
  std::string what_;
  std::optional<std::string> error_;
};

/// A non-empty string field.
Fields& named(Fields& fields, const char* name, std::string& out) {
  fields.required(name, out);
  if (!fields.error() && out.empty()) fields.fail(name, "must not be empty");
  return fields;
}

void read_assignment(Fields& fields, AssignmentMessage& out) {
  fields.number("group_rank", out.group_rank, true, 0, kMaxCount)
      .number("group_world_size", out.group_world_size, true, 1, kMaxCount)
      .number("world_size", out.world_size, true, 1, kMaxCount)
      .number("rank_offset", out.rank_offset, true, 0, kMaxCount)
      .required("master_addr", out.master_addr)
      .number("master_port", out.master_port, true, 0, 65535);
}

Parsed<JoinMessage> parse_join_fields(const json& message, const std::string& what) {
  Fields fields(message, what);
  JoinMessage join;
  fields.optional("token", join.token);
  named(fields, "job", join.job);
  named(fields, "node", join.node);
  fields.optional("addr", join.addr)
      .number("nproc", join.nproc, true, 1, kMaxCount)
      .number("node_rank", join.node_rank, false, -1, kMaxCount)
      .number("master_port", join.master_port, false, 0, 65535)
      .optional("labels", join.labels)
      .number("min_nodes", join.min_nodes, true, 1, kMaxCount)
      .number("max_nodes", join.max_nodes, true, 1, kMaxCount)
      .number("join_timeout_s", join.join_timeout_s, false, 0, kMaxSeconds)
      .number("last_call_timeout_s", join.last_call_timeout_s, false, 0, kMaxSeconds)
      .number("restart_count", join.restart_count, false, 0, kMaxCount)
      .optional("progress", join.progress);
  if (const json* gpus = fields.raw("gpus", false)) {
    if (!gpus->is_array())
      fields.fail("gpus", std::string("must be an array, not ") + kind_of(*gpus));
    else
      join.gpus = *gpus;
  }
  if (!fields.error() && join.max_nodes < join.min_nodes)
    fields.fail("max_nodes", fmt::format("({}) must not be below \"min_nodes\" ({})",
                                         join.max_nodes, join.min_nodes));
  return fields.result(std::move(join));
}

}  // namespace

std::string message_type(const json& message) {
  auto type = message.find("type");
  return type != message.end() && type->is_string() ? type->get<std::string>() : std::string();
}

Parsed<JoinMessage> parse_join(const json& message) { return parse_join_fields(message, "join"); }

Parsed<JoinMessage> parse_rejoin(const json& message) {
  auto parsed = parse_join_fields(message, "rejoin");
  if (parsed) {
    Fields fields(message, "rejoin");
    const json* assignment = fields.raw("assignment", true);
    if (!assignment) return Error{*fields.error()};
    Fields inner(*assignment, "rejoin: field \"assignment\"");
    AssignmentMessage held;
    read_assignment(inner, held);
    if (inner.error()) return Error{*inner.error()};
    parsed->assignment = held;
  }
  return parsed;
}

Parsed<LeaseRequest> parse_lease_request(const json& message) {
  Fields fields(message, "lease");
  LeaseRequest lease;
  fields.number("gpus", lease.gpus, false, 0, kMaxCount)
      .number("wait_s", lease.wait_s, false, -kMaxSeconds, kMaxSeconds)
      .optional("job", lease.job);
  if (fields.has("held_port")) {
    HeldLease held;
    fields.number("held_port", held.port, true, 0, 65535).optional("held_gpus", held.gpus);
    lease.held = std::move(held);
  }
  return fields.result(std::move(lease));
}

Parsed<OperatorRequest> parse_operator_request(const json& message) {
  OperatorRequest request;
  request.type = message_type(message);
  Fields fields(message, request.type);
  fields.optional("token", request.token);
  if (request.type != "jobs") named(fields, "job", request.job);
  return fields.result(std::move(request));
}

Parsed<BarrierArrival> parse_barrier_arrival(const json& message) {
  Fields fields(message, "barrier");
  BarrierArrival arrival;
  fields.required("name", arrival.name).number("rank", arrival.rank, true, 0, kMaxCount);
  return fields.result(std::move(arrival));
}

Parsed<FailedNotice> parse_failed(const json& message) {
  Fields fields(message, "failed");
  FailedNotice notice;
  fields.optional("node", notice.node)
      .optional("reason", notice.reason)
      .number("exit_code", notice.exit_code, false, 0, 255);
  if (const json* preflight = fields.raw("preflight", false)) {
    // The receiver reads these fields as their types. A verdict of other types is dropped, not
    // the notice: the stop it carries matters more than the verdict riding on it.
    Fields verdict(*preflight, "preflight");
    bool flag = false;
    std::string text;
    int count = 0;
    verdict.required("ok", flag)
        .optional("dead", flag)
        .optional("backend", text)
        .optional("verdict", text)
        .optional("text", text)
        .optional("judged_on", text)
        .number("world_size", count, false, 0, kMaxCount);
    if (const json* faults = verdict.raw("faults", false); faults && !faults->is_array())
      verdict.fail("faults", std::string("must be an array, not ") + kind_of(*faults));
    if (!verdict.error()) notice.preflight = *preflight;
  }
  return fields.result(std::move(notice));
}

Parsed<StallMessage> parse_stall(const json& message) {
  Fields fields(message, "stall");
  StallMessage notice;
  std::string kind, barrier, noticed_on, node;
  int rank = 0;
  fields.optional("node", node)
      .required("kind", kind)
      .required("what", notice.what)
      .optional("barrier", barrier)
      .optional("noticed_on", noticed_on)
      .number("rank", rank, false, 0, kMaxCount);
  if (const json* arrived = fields.raw("arrived", false); arrived && !arrived->is_object())
    fields.fail("arrived", std::string("must be an object, not ") + kind_of(*arrived));
  if (fields.error()) return Error{*fields.error()};
  notice.body = message;
  return notice;
}

Parsed<StallReportMessage> parse_stall_report(const json& message) {
  Fields fields(message, "stall_report");
  StallReportMessage report;
  fields.optional("node", report.node);
  const json* ranks = fields.raw("ranks", true);
  if (ranks && !ranks->is_array())
    fields.fail("ranks", std::string("must be an array, not ") + kind_of(*ranks));
  if (fields.error()) return Error{*fields.error()};
  report.ranks = *ranks;
  return report;
}

Parsed<StragglerMessage> parse_straggler(const json& message) {
  Fields fields(message, "straggler");
  StragglerMessage straggler;
  fields.optional("node", straggler.node).required("line", straggler.line);
  if (straggler.line.size() > kMaxStragglerLine)
    fields.fail("line",
                fmt::format("is {} bytes, over {}", straggler.line.size(), kMaxStragglerLine));
  return fields.result(std::move(straggler));
}

Parsed<PaceMessage> parse_pace(const json& message) {
  Fields fields(message, message_type(message));
  PaceMessage pace;
  fields.number("heartbeat_interval_ms", pace.heartbeat_interval_ms, false, 1, 86400000);
  return fields.result(pace);
}

Parsed<AssignmentMessage> parse_assignment(const json& message) {
  Fields fields(message, "assignment");
  AssignmentMessage assignment;
  read_assignment(fields, assignment);
  return fields.result(std::move(assignment));
}

Parsed<ProgressMessage> parse_progress(const json& message) {
  Fields fields(message, "progress");
  ProgressMessage progress;
  fields.number("joined", progress.joined, false, 0, kMaxCount)
      .number("min_nodes", progress.min_nodes, false, 0, kMaxCount)
      .number("max_nodes", progress.max_nodes, false, 0, kMaxCount)
      .optional("names", progress.names)
      .number("remaining_s", progress.remaining_s, false, 0, kMaxSeconds);
  return fields.result(std::move(progress));
}

namespace {

/// A message whose one optional field is a node's name.
template <class Notice>
Parsed<Notice> parse_node_field(const json& message, const char* type) {
  Fields fields(message, type);
  Notice notice;
  fields.optional("node", notice.node);
  return fields.result(std::move(notice));
}

/// A message whose one optional field is a line for the user.
template <class Text>
Parsed<Text> parse_message_field(const json& message, const char* type) {
  Fields fields(message, type);
  Text text;
  fields.optional("message", text.message);
  return fields.result(std::move(text));
}

}  // namespace

Parsed<MembershipNotice> parse_membership(const json& message) {
  return parse_node_field<MembershipNotice>(message, "membership");
}

Parsed<LostNotice> parse_lost(const json& message) {
  return parse_node_field<LostNotice>(message, "lost");
}

Parsed<ErrorMessage> parse_error(const json& message) {
  return parse_message_field<ErrorMessage>(message, "error");
}

Parsed<ClosedNotice> parse_closed(const json& message) {
  return parse_message_field<ClosedNotice>(message, "closed");
}

Parsed<QueuedNotice> parse_queued(const json& message) {
  return parse_message_field<QueuedNotice>(message, "queued");
}

Parsed<ClockReply> parse_clock_reply(const json& message) {
  Fields fields(message, "clock");
  ClockReply clock;
  if (const json* time = fields.raw("unix_time_ns", true); time && !time->is_number_integer())
    fields.fail("unix_time_ns", std::string("must be an integer, not ") + kind_of(*time));
  else if (time)
    clock.unix_time_ns = time->get<int64_t>();
  return fields.result(clock);
}

Parsed<BarrierDone> parse_barrier_done(const json& message) {
  Fields fields(message, "barrier_done");
  BarrierDone done;
  fields.required("name", done.name);
  return fields.result(std::move(done));
}

Parsed<LeaseGrant> parse_lease_grant(const json& message) {
  Fields fields(message, "lease");
  LeaseGrant grant;
  fields.optional("gpus", grant.gpus).number("port", grant.port, true, 1, 65535);
  return fields.result(std::move(grant));
}

Parsed<HelloMessage> parse_hello(const json& message) {
  Fields fields(message, "hello");
  HelloMessage hello;
  fields.number("rank", hello.rank, true, 0, kMaxCount).optional("pid", hello.pid);
  return fields.result(hello);
}

Parsed<BarrierRequest> parse_barrier_request(const json& message) {
  Fields fields(message, "barrier");
  BarrierRequest request;
  fields.required("name", request.name)
      .number("timeout_s", request.timeout_s, false, 0, kMaxSeconds);
  return fields.result(std::move(request));
}

namespace {

void read_summary(Fields& fields, JobSummary& job) {
  fields.required("id", job.id)
      .optional("owner", job.owner)
      .optional("state", job.state)
      .number("nodes", job.nodes, false, 0, kMaxCount)
      .number("ranks", job.ranks, false, 0, kMaxCount)
      .number("age_s", job.age_s, false, 0, 1e12);
}

/// Each element of array field `name`, read by `read_one`; false after an error.
template <class Item, class Read>
bool read_list(Fields& fields, const char* name, bool required, std::vector<Item>& out,
               Read read_one) {
  const json* list = fields.raw(name, required);
  if (!list) return !fields.error();
  if (!list->is_array()) {
    fields.fail(name, std::string("must be an array, not ") + kind_of(*list));
    return false;
  }
  for (size_t i = 0; i < list->size(); ++i) {
    Fields item((*list)[i], fmt::format("{}: field \"{}\" item {}", fields.what(), name, i));
    Item parsed;
    read_one(item, parsed);
    if (item.error()) {
      fields.fail(name, "holds a bad item: " + *item.error());
      return false;
    }
    out.push_back(std::move(parsed));
  }
  return true;
}

}  // namespace

Parsed<JobsReply> parse_jobs_reply(const json& message) {
  Fields fields(message, "jobs");
  JobsReply reply;
  read_list(fields, "jobs", true, reply.jobs, read_summary);
  return fields.result(std::move(reply));
}

Parsed<JobStatus> parse_status_reply(const json& message) {
  Fields outer(message, "status");
  const json* job = outer.raw("job", true);
  if (!job) return Error{*outer.error()};
  Fields fields(*job, "status: field \"job\"");
  JobStatus status;
  read_summary(fields, status.summary);
  fields.number("generation", status.generation, false, 0, std::numeric_limits<int>::max())
      .number("min_nodes", status.min_nodes, false, 0, kMaxCount)
      .number("max_nodes", status.max_nodes, false, 0, kMaxCount)
      .optional("master", status.master);
  read_list(fields, "placement", false, status.placement, [](Fields& item, JobPlacementLine& line) {
    item.optional("node", line.node)
        .optional("addr", line.addr)
        .optional("ranks", line.ranks)
        .number("group_rank", line.group_rank, false, 0, kMaxCount);
  });
  read_list(fields, "members", false, status.members, [](Fields& item, JobMember& member) {
    item.optional("node", member.node)
        .optional("connected", member.connected)
        .optional("done", member.done);
  });
  return fields.result(std::move(status));
}

Parsed<StoppedReply> parse_stopped_reply(const json& message) {
  Fields fields(message, "stopped");
  StoppedReply reply;
  fields.required("job", reply.job);
  return fields.result(std::move(reply));
}

// ---- decoding by type ----

namespace {

/// The decoders of one end's messages, by "type".
template <class Variant>
using DecoderTable =
    std::map<std::string, std::function<Parsed<Variant>(const json&)>, std::less<>>;

/// A decoder of the variant from one type's parse function.
template <class Variant, class Message>
std::function<Parsed<Variant>(const json&)> into(Parsed<Message> (*parse)(const json&)) {
  return [parse](const json& message) -> Parsed<Variant> {
    auto parsed = parse(message);
    if (!parsed) return Error{"malformed " + parsed.error().message};
    return Variant(std::move(*parsed));
  };
}

/// A decoder of a message with no fields.
template <class Variant, class Message>
std::function<Parsed<Variant>(const json&)> empty() {
  return [](const json&) -> Parsed<Variant> { return Variant(Message{}); };
}

template <class Variant>
Parsed<Variant> decode_with(const DecoderTable<Variant>& table, const json& message) {
  const std::string type = message_type(message);
  auto decoder = table.find(type);
  if (decoder == table.end()) return Error{"unknown message type '" + type + "'"};
  return decoder->second(message);
}

}  // namespace

Parsed<AgentMessage> decode_agent_message(const json& message) {
  using V = AgentMessage;
  static const DecoderTable<V> table = {
      {"join", into<V>(parse_join)},
      {"rejoin", into<V>(parse_rejoin)},
      {"heartbeat", empty<V, HeartbeatMessage>()},
      {"done", empty<V, DoneMessage>()},
      {"failed", into<V>(parse_failed)},
      {"stall", into<V>(parse_stall)},
      {"stall_report", into<V>(parse_stall_report)},
      {"straggler", into<V>(parse_straggler)},
      {"barrier", into<V>(parse_barrier_arrival)},
      {"clock", empty<V, ClockRequest>()},
      {"lease", into<V>(parse_lease_request)},
      {"jobs", into<V>(parse_operator_request)},
      {"status", into<V>(parse_operator_request)},
      {"stop", into<V>(parse_operator_request)},
  };
  return decode_with(table, message);
}

Parsed<RendezvousMessage> decode_rendezvous_message(const json& message) {
  using V = RendezvousMessage;
  static const DecoderTable<V> table = {
      {"joined", empty<V, JoinedMessage>()},
      {"assignment", into<V>(parse_assignment)},
      {"pace", into<V>(parse_pace)},
      {"progress", into<V>(parse_progress)},
      {"membership", into<V>(parse_membership)},
      {"lost", into<V>(parse_lost)},
      {"failed", into<V>(parse_failed)},
      {"error", into<V>(parse_error)},
      {"closed", into<V>(parse_closed)},
      {"noted", empty<V, FailureNoted>()},
      {"stall", into<V>(parse_stall)},
      {"stall_report", into<V>(parse_stall_report)},
      {"straggler", into<V>(parse_straggler)},
      {"barrier_done", into<V>(parse_barrier_done)},
      {"clock", into<V>(parse_clock_reply)},
      {"lease", into<V>(parse_lease_grant)},
      {"queued", into<V>(parse_queued)},
      {"jobs", into<V>(parse_jobs_reply)},
      {"status", into<V>(parse_status_reply)},
      {"stopped", into<V>(parse_stopped_reply)},
  };
  return decode_with(table, message);
}

Parsed<WorkerMessage> decode_worker_message(const json& message) {
  using V = WorkerMessage;
  static const DecoderTable<V> table = {
      {"hello", into<V>(parse_hello)},
      {"heartbeat", empty<V, HeartbeatMessage>()},
      {"barrier", into<V>(parse_barrier_request)},
  };
  return decode_with(table, message);
}

}  // namespace mcprun
