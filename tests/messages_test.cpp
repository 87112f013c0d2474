#include "common/messages.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace mcprun {
namespace {

using json = nlohmann::json;

/// A parse function, type-erased: the error, or empty when the message parsed.
using Parser = std::function<std::string(const json&)>;

template <class Message>
Parser parser(Parsed<Message> (*parse)(const json&)) {
  return [parse](const json& message) {
    auto parsed = parse(message);
    return parsed ? std::string() : parsed.error().message;
  };
}

/// Every message type with one valid example: the examples are what mcprun really sends.
struct Case {
  std::string name;
  Parser parse;
  json valid;
  std::vector<std::string> required;  ///< Fields whose absence is refused.
};

std::vector<Case> cases() {
  const json join = {{"type", "join"},
                     {"job", "j"},
                     {"node", "a"},
                     {"addr", "10.0.0.1"},
                     {"nproc", 2},
                     {"master_port", 29500},
                     {"node_rank", -1},
                     {"labels", {{"rack", "r1"}}},
                     {"gpus", json::array({{{"bus_id", "0:1"}}})},
                     {"min_nodes", 1},
                     {"max_nodes", 2},
                     {"join_timeout_s", 120.0},
                     {"last_call_timeout_s", 5.0},
                     {"token", "t"},
                     {"restart_count", 2},
                     {"progress", false}};
  json rejoin = join;
  rejoin["type"] = "rejoin";
  rejoin["assignment"] = {{"group_rank", 0},  {"group_world_size", 2},     {"world_size", 4},
                          {"rank_offset", 0}, {"master_addr", "10.0.0.1"}, {"master_port", 29500}};
  return {
      {"join", parser(parse_join), join, {"job", "node", "nproc", "min_nodes", "max_nodes"}},
      {"rejoin", parser(parse_rejoin), rejoin, {"job", "node", "nproc", "assignment"}},
      {"lease",
       parser(parse_lease_request),
       {{"type", "lease"},
        {"gpus", 2},
        {"wait_s", 1.5},
        {"job", "x"},
        {"held_gpus", {"0000:01:00.0"}},
        {"held_port", 29500}},
       {}},
      {"stop",
       parser(parse_operator_request),
       {{"type", "stop"}, {"job", "x"}, {"token", "t"}},
       {"job"}},
      {"barrier arrival",
       parser(parse_barrier_arrival),
       {{"type", "barrier"}, {"name", "b"}, {"rank", 3}},
       {"name", "rank"}},
      {"failed",
       parser(parse_failed),
       {{"type", "failed"}, {"node", "a"}, {"reason", "rank 1 exited 7"}, {"exit_code", 7}},
       {}},
      {"failed preflight",
       parser(parse_failed),
       {{"type", "failed"},
        {"node", "a"},
        {"reason", "the preflight failed on a"},
        {"exit_code", 77},
        {"preflight", {{"ok", false}, {"verdict", "FAIL: node c is SLOW"}}}},
       {}},
      {"stall",
       parser(parse_stall),
       {{"type", "stall"},
        {"kind", "barrier"},
        {"what", "barrier b"},
        {"barrier", "b"},
        {"rank", 1},
        {"noticed_on", "h"},
        {"arrived", {{"10.0.0.1", {1, 2}}}}},
       {"kind", "what"}},
      {"stall_report",
       parser(parse_stall_report),
       {{"type", "stall_report"}, {"node", "a"}, {"ranks", json::array()}},
       {"ranks"}},
      {"straggler",
       parser(parse_straggler),
       {{"type", "straggler"}, {"node", "a"}, {"line", "straggler: rank 3"}},
       {"line"}},
      {"joined", parser(parse_pace), {{"type", "joined"}, {"heartbeat_interval_ms", 5000}}, {}},
      {"pace", parser(parse_pace), {{"type", "pace"}, {"heartbeat_interval_ms", 16384}}, {}},
      {"assignment",
       parser(parse_assignment),
       {{"type", "assignment"},
        {"group_rank", 1},
        {"group_world_size", 2},
        {"world_size", 4},
        {"rank_offset", 2},
        {"master_addr", "10.0.0.1"},
        {"master_port", 29500}},
       {"group_rank", "group_world_size", "world_size", "rank_offset", "master_addr",
        "master_port"}},
      {"progress",
       parser(parse_progress),
       {{"type", "progress"},
        {"joined", 1},
        {"min_nodes", 2},
        {"max_nodes", 2},
        {"names", {"a"}},
        {"remaining_s", 3.5}},
       {}},
      {"membership", parser(parse_membership), {{"type", "membership"}, {"node", "c"}}, {}},
      {"lost", parser(parse_lost), {{"type", "lost"}, {"node", "b"}}, {}},
      {"error", parser(parse_error), {{"type", "error"}, {"message", "refused"}}, {}},
      {"closed", parser(parse_closed), {{"type", "closed"}, {"message", "job j cannot"}}, {}},
      {"queued", parser(parse_queued), {{"type", "queued"}, {"message", "behind a"}}, {}},
      {"clock reply",
       parser(parse_clock_reply),
       {{"type", "clock"}, {"unix_time_ns", int64_t{1765000000123456789}}},
       {"unix_time_ns"}},
      {"barrier_done",
       parser(parse_barrier_done),
       {{"type", "barrier_done"}, {"name", "b"}},
       {"name"}},
      {"lease grant",
       parser(parse_lease_grant),
       {{"type", "lease"},
        {"gpus", {"0000:01:00.0"}},
        {"port", 29500},
        {"heartbeat_interval_ms", 5000}},
       {"port"}},
      {"hello", parser(parse_hello), {{"type", "hello"}, {"rank", 0}, {"pid", 42}}, {"rank"}},
      {"barrier request",
       parser(parse_barrier_request),
       {{"type", "barrier"}, {"name", "b"}, {"timeout_s", 30.0}},
       {"name"}},
      {"jobs reply",
       parser(parse_jobs_reply),
       {{"type", "jobs"},
        {"jobs",
         {{{"id", "x"},
           {"owner", "u"},
           {"nodes", 1},
           {"ranks", 2},
           {"state", "running"},
           {"age_s", 1.5}}}}},
       {"jobs"}},
      {"status reply",
       parser(parse_status_reply),
       {{"type", "status"},
        {"job",
         {{"id", "x"},
          {"owner", "u"},
          {"nodes", 1},
          {"ranks", 2},
          {"state", "running"},
          {"age_s", 1.5},
          {"generation", 3},
          {"min_nodes", 1},
          {"max_nodes", 1},
          {"master", "h:1"},
          {"placement", {{{"node", "a"}, {"addr", "h"}, {"group_rank", 0}, {"ranks", "0-1"}}}},
          {"members", {{{"node", "a"}, {"connected", true}, {"done", false}}}}}}},
       {"job"}},
      {"stopped reply", parser(parse_stopped_reply), {{"type", "stopped"}, {"job", "x"}}, {"job"}},
  };
}

/// Values of every JSON type, and the hostile shapes: a huge string, deep nesting.
std::vector<json> wrong_values() {
  json deep = json::array();
  for (int i = 0; i < 20; ++i) deep = json::array({deep});
  return {"text",
          5,
          -1,
          2.5,
          1e300,
          true,
          false,
          json::array({1, "a"}),
          json::object({{"k", 1}}),
          std::string(60000, 'x'),
          deep,
          static_cast<uint64_t>(1) << 63};
}

TEST(Messages, EveryRealMessageParses) {
  for (const Case& c : cases()) EXPECT_EQ(c.parse(c.valid), "") << c.name;
}

/// `message` decoded by whichever end may receive it and encoded again; null when no end can.
json round_trip(const json& message) {
  auto again = [](const auto& decoded) -> json {
    if (!decoded) return nullptr;
    return std::visit([](const auto& typed) { return encode(typed); }, *decoded);
  };
  for (json encoded :
       {again(decode_agent_message(message)), again(decode_rendezvous_message(message)),
        again(decode_worker_message(message))})
    if (encoded == message) return encoded;
  return nullptr;
}

TEST(Messages, EveryRealMessageEncodesToWhatItWasDecodedFrom) {
  for (Case c : cases()) {
    // The daemon's pace rides on its frames (paced()); it is all that "pace" carries.
    if (c.name != "pace") c.valid.erase("heartbeat_interval_ms");
    EXPECT_EQ(round_trip(c.valid), c.valid) << c.name;
  }
  for (const char* bare : {"heartbeat", "done", "clock", "joined", "noted"})
    EXPECT_EQ(round_trip({{"type", bare}}), json({{"type", bare}})) << bare;
}

TEST(Messages, AJoinCarryingItsAssignmentIsARejoin) {
  auto join = *parse_join(cases()[0].valid);
  EXPECT_EQ(encode(join)["type"], "join");
  join.assignment = *parse_assignment(cases()[1].valid["assignment"]);
  EXPECT_EQ(encode(join)["type"], "rejoin");
  EXPECT_TRUE(std::holds_alternative<JoinMessage>(*decode_agent_message(encode(join))));
  EXPECT_TRUE(parse_rejoin(encode(join)));
}

TEST(Messages, EachEndRefusesWhatItDoesNotExpectInOneLine) {
  EXPECT_EQ(decode_agent_message({{"type", "assignment"}}).error().message,
            "unknown message type 'assignment'");
  EXPECT_EQ(decode_worker_message({{"type", "join"}}).error().message,
            "unknown message type 'join'");
  EXPECT_EQ(decode_rendezvous_message({{"type", "barrier_done"}}).error().message,
            "malformed barrier_done: field \"name\" is missing");
  EXPECT_TRUE(std::holds_alternative<BarrierArrival>(
      *decode_agent_message({{"type", "barrier"}, {"name", "b"}, {"rank", 0}})));
  EXPECT_TRUE(std::holds_alternative<BarrierRequest>(
      *decode_worker_message({{"type", "barrier"}, {"name", "b"}})));
}

TEST(Messages, EveryMissingRequiredFieldIsNamed) {
  for (const Case& c : cases())
    for (const std::string& field : c.required) {
      json message = c.valid;
      message.erase(field);
      const std::string error = c.parse(message);
      EXPECT_NE(error.find("\"" + field + "\""), std::string::npos) << c.name << ": " << error;
      EXPECT_NE(error.find("missing"), std::string::npos) << c.name << ": " << error;
      message[field] = nullptr;  // A null is as good as absent.
      EXPECT_NE(c.parse(message), "") << c.name << " " << field;
    }
}

TEST(Messages, EveryFieldOfEveryWrongTypeIsRefusedOrAcceptedWithoutThrowing) {
  for (const Case& c : cases())
    for (const auto& [field, value] : c.valid.items()) {
      if (field == "type") continue;
      for (const json& wrong : wrong_values()) {
        json message = c.valid;
        message[field] = wrong;
        std::string error;
        ASSERT_NO_THROW(error = c.parse(message))
            << c.name << " " << field << " = " << wrong.type_name();
        // A refusal names the field, in one line.
        if (!error.empty()) {
          EXPECT_NE(error.find("\"" + field + "\""), std::string::npos) << c.name << ": " << error;
          EXPECT_EQ(error.find('\n'), std::string::npos) << error;
        }
      }
    }
}

TEST(Messages, WrongTypesAreRefusedWithTheKindNamed) {
  auto error = parse_join({{"job", "x"}, {"token", 5}}).error().message;
  EXPECT_EQ(error, "join: field \"token\" must be a string, not an integer");
  error = parse_barrier_arrival({{"name", "b"}, {"rank", "3"}}).error().message;
  EXPECT_EQ(error, "barrier: field \"rank\" must be an integer, not a string");
  error = parse_lease_request({{"gpus", 1.5}}).error().message;
  EXPECT_EQ(error, "lease: field \"gpus\" must be an integer, not a number with a fraction");
  error = parse_hello({{"rank", 0}, {"pid", "x"}}).error().message;
  EXPECT_EQ(error, "hello: field \"pid\" must be an integer, not a string");
  error = parse_rejoin({{"job", "j"},
                        {"node", "a"},
                        {"nproc", 1},
                        {"min_nodes", 1},
                        {"max_nodes", 1},
                        {"assignment", 3}})
              .error()
              .message;
  EXPECT_EQ(error, "rejoin: field \"assignment\": expected an object, not an integer");
}

TEST(Messages, NumbersOutsideTheirRangeAreRefused) {
  json join = cases()[0].valid;
  join["nproc"] = 0;
  EXPECT_NE(parse_join(join).error().message.find("\"nproc\" must be between 1"),
            std::string::npos);
  join["nproc"] = static_cast<uint64_t>(1) << 40;
  EXPECT_NE(parse_join(join).error().message.find("\"nproc\""), std::string::npos);
  join = cases()[0].valid;
  join["join_timeout_s"] = 1e300;  // Would overflow the conversion to milliseconds.
  EXPECT_NE(parse_join(join).error().message.find("\"join_timeout_s\""), std::string::npos);
  join = cases()[0].valid;
  join["max_nodes"] = 0;
  EXPECT_FALSE(parse_join(join));
  join["min_nodes"] = 3;
  join["max_nodes"] = 2;
  EXPECT_NE(parse_join(join).error().message.find("below \"min_nodes\""), std::string::npos);
  EXPECT_FALSE(parse_lease_request({{"gpus", -1}}));
  EXPECT_FALSE(parse_lease_request({{"wait_s", 1e300}}));
  EXPECT_FALSE(parse_failed({{"exit_code", 300}}));
  // Well-framed nonsense from a peer: a verdict of the wrong types is dropped before anyone
  // reads it, and the stop it came with still stands.
  for (const json& verdict : {json("FAIL"), json{{"ok", "no"}}, json{{"ok", false}, {"text", 5}},
                              json{{"ok", false}, {"faults", "slow"}}, json::object()}) {
    const auto failed = parse_failed({{"preflight", verdict}, {"exit_code", 77}});
    ASSERT_TRUE(failed) << verdict.dump();
    EXPECT_TRUE(failed->preflight.is_null()) << verdict.dump();
    EXPECT_EQ(failed->exit_code, 77);
  }
  join = cases()[0].valid;
  join["restart_count"] = -1;
  EXPECT_NE(parse_join(join).error().message.find("\"restart_count\" must be between 0"),
            std::string::npos);
}

TEST(Messages, AStragglerLineLongEnoughToFloodAConsoleIsRefused) {
  EXPECT_EQ(parse_straggler({{"type", "straggler"}, {"line", "straggler: rank 1"}})->line,
            "straggler: rank 1");
  auto flood = parse_straggler({{"type", "straggler"}, {"line", std::string(4096, 'x')}});
  ASSERT_FALSE(flood);
  EXPECT_NE(flood.error().message.find("\"line\" is 4096 bytes"), std::string::npos)
      << flood.error().message;
}

TEST(Messages, ParsedFieldsCarryTheirValues) {
  auto join = *parse_rejoin(cases()[1].valid);
  EXPECT_EQ(join.job, "j");
  EXPECT_EQ(join.nproc, 2);
  EXPECT_EQ(join.gpus.size(), 1u);
  EXPECT_EQ(join.labels.at("rack"), "r1");
  ASSERT_TRUE(join.assignment);
  EXPECT_EQ(join.assignment->world_size, 4);
  EXPECT_EQ(join.restart_count, 2);
  json first_join = cases()[0].valid;
  first_join.erase("restart_count");
  EXPECT_EQ(parse_join(first_join)->restart_count, 0);
  auto lease = *parse_lease_request(cases()[2].valid);
  ASSERT_TRUE(lease.held);
  EXPECT_EQ(lease.held->port, 29500);
  EXPECT_EQ(lease.held->gpus, std::vector<std::string>{"0000:01:00.0"});
  EXPECT_FALSE(parse_lease_request({{"gpus", 1}})->held);
  auto request = *parse_operator_request({{"type", "jobs"}});
  EXPECT_EQ(request.type, "jobs");
  EXPECT_FALSE(parse_operator_request({{"type", "status"}}));
  auto status = *parse_status_reply(cases().at(cases().size() - 2).valid);
  EXPECT_EQ(status.placement.at(0).ranks, "0-1");
  EXPECT_TRUE(status.members.at(0).connected);
}

TEST(Messages, ListItemsOfTheWrongShapeAreNamed) {
  auto error = parse_jobs_reply({{"jobs", {1}}}).error().message;
  EXPECT_NE(error.find("item 0"), std::string::npos) << error;
  error = parse_progress({{"names", {"a", 2}}}).error().message;
  EXPECT_EQ(error, "progress: field \"names\" must be an array of strings, not an array");
  error = parse_join({{"job", "j"},
                      {"node", "a"},
                      {"nproc", 1},
                      {"min_nodes", 1},
                      {"max_nodes", 1},
                      {"labels", {{"rack", 1}}}})
              .error()
              .message;
  EXPECT_EQ(error, "join: field \"labels\" must be an object of strings, not an object");
}

TEST(Messages, NonObjectsAreRefused) {
  for (const Case& c : cases())
    for (const json& wrong : {json(5), json("x"), json::array(), json()})
      EXPECT_NE(c.parse(wrong), "") << c.name;
}

}  // namespace
}  // namespace mcprun
