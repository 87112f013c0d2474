#include "tests/fuzz/fuzz_entry_points.hpp"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/messages.hpp"
#include "common/protocol.hpp"
#include "launcher/config/launch_config.hpp"
#include "launcher/store/tcp_store.hpp"
#include "launcher/watch/file_timer.hpp"

namespace mcprun::fuzz {
namespace {

using json = nlohmann::json;

/// Every parser on one message; a valid result is encoded again, as a relay or a reply would.
void parse_everything(const json& message) {
  auto visit = [](const auto&) {};  // The parse is the test; sanitizers judge it.
  visit(parse_join(message));
  visit(parse_rejoin(message));
  visit(parse_lease_request(message));
  visit(parse_operator_request(message));
  visit(parse_barrier_arrival(message));
  visit(parse_failed(message));
  visit(parse_stall(message));
  visit(parse_stall_report(message));
  visit(parse_straggler(message));
  visit(parse_pace(message));
  visit(parse_assignment(message));
  visit(parse_progress(message));
  visit(parse_membership(message));
  visit(parse_lost(message));
  visit(parse_error(message));
  visit(parse_closed(message));
  visit(parse_queued(message));
  visit(parse_barrier_done(message));
  visit(parse_clock_reply(message));
  visit(parse_lease_grant(message));
  visit(parse_hello(message));
  visit(parse_barrier_request(message));
  visit(parse_jobs_reply(message));
  visit(parse_status_reply(message));
  visit(parse_stopped_reply(message));
  auto reencode = [](const auto& decoded) {
    if (decoded)
      std::visit([](const auto& typed) { static_cast<void>(encode_frame(encode(typed))); },
                 *decoded);
  };
  reencode(decode_agent_message(message));
  reencode(decode_rendezvous_message(message));
  reencode(decode_worker_message(message));
  static_cast<void>(message_type(message));
}

/// Decodes every frame of `stream`, arriving `step` bytes at a time.
void decode_stream(std::string_view stream, size_t step) {
  std::string buffer;
  for (size_t at = 0; at < stream.size(); at += step) {
    buffer.append(stream.substr(at, step));
    for (;;) {
      FrameResult result = decode_frame(buffer);
      if (auto* frame = std::get_if<Frame>(&result)) {
        parse_everything(frame->message);
        buffer.erase(0, frame->consumed);
        continue;
      }
      if (std::holds_alternative<FrameError>(result)) return;  // The connection would close.
      break;
    }
  }
}

std::string framed(const std::string& payload) {
  std::string frame(kFrameHeaderBytes, '\0');
  const auto length = static_cast<uint32_t>(payload.size());
  for (size_t i = 0; i < kFrameHeaderBytes; ++i)
    frame[i] = static_cast<char>((length >> (8 * (kFrameHeaderBytes - 1 - i))) & 0xff);
  return frame + payload;
}

/// Real messages, as agents, the daemon, operators and workers send them.
const std::vector<json>& real_messages() {
  static const std::vector<json> messages = {
      {{"type", "join"},
       {"job", "j"},
       {"node", "a"},
       {"nproc", 2},
       {"master_port", 29500},
       {"node_rank", -1},
       {"labels", {{"rack", "r1"}}},
       {"gpus", json::array()},
       {"min_nodes", 1},
       {"max_nodes", 2},
       {"join_timeout_s", 120.0},
       {"last_call_timeout_s", 5.0},
       {"token", "t"},
       {"restart_count", 1}},
      {{"type", "rejoin"},
       {"job", "j"},
       {"node", "a"},
       {"nproc", 2},
       {"min_nodes", 1},
       {"max_nodes", 2},
       {"assignment",
        {{"group_rank", 0},
         {"group_world_size", 1},
         {"world_size", 2},
         {"rank_offset", 0},
         {"master_addr", "h"},
         {"master_port", 1}}}},
      {{"type", "lease"},
       {"gpus", 1},
       {"wait_s", 2.0},
       {"job", "x"},
       {"held_gpus", {"0:1"}},
       {"held_port", 29500}},
      {{"type", "status"}, {"job", "x"}, {"token", "t"}},
      {{"type", "barrier"}, {"name", "b"}, {"rank", 1}, {"timeout_s", 30.0}},
      {{"type", "failed"}, {"node", "a"}, {"reason", "r"}, {"exit_code", 7}},
      {{"type", "stall"}, {"kind", "init"}, {"what", "w"}, {"rank", 1}, {"arrived", {{"h", {1}}}}},
      {{"type", "stall_report"}, {"node", "a"}, {"ranks", json::array()}},
      {{"type", "progress"},
       {"joined", 1},
       {"min_nodes", 1},
       {"max_nodes", 2},
       {"names", {"a"}},
       {"remaining_s", 1.0}},
      {{"type", "lease"}, {"gpus", {"0:1"}}, {"port", 29500}, {"heartbeat_interval_ms", 5000}},
      {{"type", "hello"}, {"rank", 0}, {"pid", 1}},
      {{"type", "closed"}, {"message", "job j cannot restart"}},
      {{"type", "jobs"}, {"jobs", {{{"id", "x"}, {"nodes", 1}, {"age_s", 1.0}}}}},
      {{"type", "status"},
       {"job", {{"id", "x"}, {"placement", {{{"node", "a"}}}}, {"members", {{{"node", "a"}}}}}}},
  };
  return messages;
}

}  // namespace

void frames(const uint8_t* data, size_t size) {
  if (size < 3) return;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 3, size - 3);
  switch (data[0] % 3) {
    case 0:  // A raw stream, as a peer's bytes arrive.
      return decode_stream(rest, data[1] % 16 + 1);
    case 1:  // One payload.
      return decode_stream(framed(std::string(rest)), data[1] % 64 + 1);
    default: {  // A real message with one field of whatever type the input holds.
      const auto& messages = real_messages();
      json message = messages[data[1] % messages.size()];
      json value = json::parse(rest, nullptr, /*allow_exceptions=*/false);
      if (value.is_discarded()) value = std::string(rest);
      size_t index = data[2] % (message.size() + 1);
      if (index == message.size()) {
        message[std::string(rest.substr(0, 8))] = value;  // A new or duplicated field.
      } else {
        auto it = message.begin();
        std::advance(it, index);
        if (value.is_string() && rest.empty())
          message.erase(it);  // Missing.
        else
          *it = value;
      }
      message["v"] = kProtocolVersion;
      if (!message.contains("type") || !message["type"].is_string()) message["type"] = "join";
      return decode_stream(framed(message.dump(-1, ' ', false, json::error_handler_t::replace)),
                           data[2] % 32 + 1);
    }
  }
}

namespace {

/// Swallows what the store would send to other connections.
struct NullOutlet : StoreOutlet {
  void deliver(uint64_t, std::string_view) override {}
  void changed(StoreEvent::Kind, uint64_t, std::string_view, int64_t) override {}
};

}  // namespace

void store_protocol(const uint8_t* data, size_t size) {
  if (size < 1) return;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t step = data[0] % 32 + 1;
  NullOutlet outlet;
  StoreState state(outlet);
  // Two connections: the second sees what the first left in the store (waiters, watches).
  for (uint64_t connection : {1, 2}) {
    StoreProtocol protocol(state, connection);
    std::string pending, replies;
    for (size_t at = 0; at < input.size() && !protocol.failed(); at += step) {
      pending.append(input.substr(at, step));
      pending.erase(0, protocol.consume(pending, replies));
    }
    state.drop_connection(connection);
  }
}

void timer_lines(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  while (!input.empty()) {
    const size_t newline = input.find('\n');
    static_cast<void>(parse_timer_request(input.substr(0, newline)));
    if (newline == std::string_view::npos) break;
    input.remove_prefix(newline + 1);
  }
}

namespace {

/// A scratch file for the job file target, one per process.
const std::string& scratch_file() {
  static const std::string path = [] {
    std::string pattern = "/tmp/mcprun-fuzz-job-XXXXXX";
    const int fd = ::mkstemp(pattern.data());
    if (fd >= 0) ::close(fd);
    return pattern;
  }();
  return path;
}

}  // namespace

void job_file(const uint8_t* data, size_t size) {
  const std::string& path = scratch_file();
  if (FILE* out = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, out);
    std::fclose(out);
  }
  static_cast<void>(parse_launch_config({"--config", path, "--dry-run", "train.py"}));
}

void command_line(const uint8_t* data, size_t size) {
  std::vector<std::string> args(1);
  for (size_t i = 0; i < size && args.size() < 64; ++i) {
    if (data[i] == '\0')
      args.emplace_back();
    else
      args.back() += static_cast<char>(data[i]);
  }
  static_cast<void>(parse_launch_config(args));
}

const std::vector<Target>& targets() {
  static const std::vector<Target> all = {{"frames", frames},
                                          {"store_protocol", store_protocol},
                                          {"timer_lines", timer_lines},
                                          {"job_file", job_file},
                                          {"command_line", command_line}};
  return all;
}

}  // namespace mcprun::fuzz
