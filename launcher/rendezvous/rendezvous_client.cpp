#include "launcher/rendezvous/rendezvous_client.hpp"

#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cstdio>
#include <optional>
#include <utility>

#include "common/endpoint.hpp"
#include "common/event_loop.hpp"
#include "common/exit_status.hpp"
#include "common/logging.hpp"
#include "common/messages.hpp"
#include "common/protocol.hpp"

namespace mcprun {

namespace asio = boost::asio;

/// One connection to the rendezvous; it hands the client each message and its end, until the
/// client lets it go.
class RendezvousClient::Connection : public FramedSession {
 public:
  Connection(Socket socket, std::string peer, RendezvousClient& client)
      : FramedSession(std::move(socket), std::move(peer), kUnmeteredLimits), client_(&client) {}
  /// The client is gone, or has moved on: nothing more reaches it from here.
  void detach() { client_ = nullptr; }

 private:
  void on_frame(const nlohmann::json& message) override {
    if (client_) client_->take_pace(message);
    if (!client_ || !client_->on_message_) return;
    // Nothing the daemon sends may end this node's job from inside a handler.
    try {
      client_->on_message_(message);
    } catch (const std::exception& bad) {
      client_->ignore_malformed("message (" + std::string(bad.what()) + ")");
    }
  }
  void on_closed() override {
    if (client_) client_->connection_lost();
  }
  RendezvousClient* client_;
};

RendezvousClient::RendezvousClient(asio::io_context& io, std::string endpoint)
    : io_(io), endpoint_(std::move(endpoint)), heartbeat_timer_(io), reconnect_timer_(io) {}

RendezvousClient::~RendezvousClient() {
  *alive_ = false;
  heartbeat_timer_.cancel();
  reconnect_timer_.cancel();
  if (connection_) {
    connection_->detach();
    connection_->close();
  }
}

std::string RendezvousClient::local_address() const { return local_address_; }

Expected<void> RendezvousClient::connect() {
  auto endpoint = parse_endpoint(endpoint_, kConnectRules);
  if (!endpoint) return Error{"--rdzv-endpoint " + endpoint.error().message};
  auto dialled = connect_within(io_, *endpoint, kConnectTimeout);
  if (!dialled)
    return Error{"cannot reach rendezvous at " + endpoint_ + ": " + dialled.error().message +
                 " (is rendezvousd running there?)"};
  local_address_ = dialled->local_address;
  if (connection_) connection_->detach();
  connection_ = std::make_shared<Connection>(std::move(dialled->socket),
                                             "the rendezvous at " + endpoint_, *this);
  connection_->start(std::chrono::milliseconds::zero());  // The join and lease waits bound it.
  return {};
}

Expected<Assignment> RendezvousClient::join(nlohmann::json join, std::chrono::milliseconds limit) {
  if (auto connected = connect(); !connected) return connected.error();
  if (!join.contains("addr") || join["addr"].get<std::string>().empty())
    join["addr"] = local_address();
  const bool show_progress = ::isatty(STDERR_FILENO);  // A CI log gets no redraws.
  join["type"] = "join";
  join["progress"] = show_progress;
  join_ = join;
  std::optional<nlohmann::json> reply;
  bool progress_shown = false;
  on_message_ = [&](const nlohmann::json& message) {
    const std::string type = message_type(message);
    if (type == "joined") {
      heartbeat();
    } else if (type == "progress") {
      if (!show_progress) return;
      auto parsed = parse_progress(message);
      if (!parsed) return ignore_malformed(parsed.error().message);
      const ProgressMessage& progress = *parsed;
      const int min = progress.min_nodes, max = progress.max_nodes;
      std::string names;
      for (const auto& name : progress.names) names += (names.empty() ? "" : ", ") + name;
      std::fprintf(
          stderr, "\rmcprun: %d/%s nodes joined: %s; waiting %.0f s more\x1b[K", progress.joined,
          (min == max ? std::to_string(max) : std::to_string(min) + ".." + std::to_string(max))
              .c_str(),
          names.c_str(), progress.remaining_s);
      progress_shown = true;
    } else if (!reply) {
      reply = message;
    } else {
      early_.push_back(message);  // Read with the assignment, before watch(): a failure, say.
    }
  };
  send(join);
  const bool answered = run_until(
      io_, [&] { return reply.has_value() || closed_; }, limit);
  on_message_ = nullptr;  // It refers to this frame's locals.
  if (progress_shown) std::fputc('\n', stderr);
  if (!answered)
    return Error{"no rendezvous assignment within " + std::to_string(limit.count() / 1000) + " s"};
  if (!reply) return Error{"the rendezvous at " + endpoint_ + " closed the connection"};
  const std::string type = message_type(*reply);
  if (type == "lost") return Error{"the rendezvous at " + endpoint_ + " closed the connection"};
  if (type == "error" || type == "closed") {
    auto refused = parse_text(*reply);
    if (!refused) return Error{"rendezvous: malformed " + refused.error().message};
    if (type == "closed") job_closed_ = refused->message;
    return Error{"rendezvous: " + refused->message};
  }
  if (type != "assignment") return Error{"rendezvous: unexpected reply '" + type + "'"};
  auto parsed = parse_assignment(*reply);
  if (!parsed) return Error{"rendezvous: malformed " + parsed.error().message};
  const AssignmentMessage& assignment = *parsed;
  assignment_ =
      Assignment{assignment.group_rank,  assignment.group_world_size, assignment.world_size,
                 assignment.rank_offset, assignment.master_addr,      assignment.master_port};
  return *assignment_;
}

Expected<GrantedLease> RendezvousClient::lease(nlohmann::json request,
                                               std::chrono::milliseconds limit) {
  if (auto connected = connect(); !connected) return connected.error();
  request["type"] = "lease";
  std::optional<nlohmann::json> reply;
  on_message_ = [&](const nlohmann::json& message) {
    if (message_type(message) != "queued") {
      if (!reply) reply = message;
      return;
    }
    auto queued = parse_text(message);
    if (!queued) return ignore_malformed(queued.error().message);
    spdlog::info("waiting up to {:g} s for a GPU lease: {}", request.value("wait_s", 0.0),
                 queued->message);
  };
  send(request);
  const bool answered = run_until(
      io_, [&] { return reply.has_value() || closed_; }, limit);
  on_message_ = nullptr;  // It refers to this frame's locals.
  if (!answered)
    return Error{"rendezvousd at " + endpoint_ + " did not answer the lease request within " +
                 std::to_string(limit.count() / 1000) + " s"};
  if (!reply) return Error{"rendezvousd at " + endpoint_ + " closed the connection"};
  if (message_type(*reply) == "error") {
    auto refused = parse_text(*reply);
    if (!refused) return Error{"malformed " + refused.error().message};
    return Error{refused->message};
  }
  auto parsed = parse_lease_grant(*reply);
  if (!parsed) return Error{"rendezvousd sent a malformed " + parsed.error().message};
  const LeaseGrant& grant = *parsed;
  heartbeat();  // The lease lasts as long as this connection does.
  GrantedLease granted{grant.gpus, grant.port};
  lease_ = request;
  lease_["held_gpus"] = granted.gpus;
  lease_["held_port"] = granted.port;
  return granted;
}

void RendezvousClient::watch(PeerEvents events) {
  auto stopped = std::make_shared<bool>(false);
  auto stop_once = [on_stop = events.on_stop, stopped](const PeerStop& stop) {
    if (!*stopped && on_stop) {
      *stopped = true;
      on_stop(stop);
    }
  };
  on_message_ = [this, stop_once, events](const nlohmann::json& message) {
    const std::string type = message_type(message);
    if (type == "failed") {
      auto parsed = parse_failed(message);
      if (!parsed) return ignore_malformed(parsed.error().message);
      const FailedNotice& failed = *parsed;
      stop_once({"node " + (failed.node.empty() ? "?" : failed.node) + ": " + failed.reason,
                 failed.exit_code});
    } else if (type == "membership" || type == "lost") {
      auto parsed = parse_node_notice(message);
      if (!parsed) return ignore_malformed(parsed.error().message);
      const std::string& node = parsed->node;
      if (type == "membership")
        stop_once({"node " + node + " joins the job; re-forming the round", kExitRendezvous, true});
      else
        stop_once({node + " was lost (it stopped answering)", kExitRendezvous});
    } else if (type == "noted") {
      failure_noted_ = true;
    } else if (type == "closed") {
      auto parsed = parse_text(message);
      if (!parsed) return ignore_malformed(parsed.error().message);
      job_closed_ = parsed->message;
    } else if (type == "stall" && events.on_stall) {
      auto parsed = parse_stall(message);
      if (!parsed) return ignore_malformed(parsed.error().message);
      events.on_stall(parsed->body);
    } else if (type == "stall_report" && events.on_stall_report) {
      auto parsed = parse_stall_report(message);
      if (!parsed) return ignore_malformed(parsed.error().message);
      events.on_stall_report(parsed->body);
    } else if (type == "straggler" && events.on_straggler) {
      auto parsed = parse_straggler(message);
      if (!parsed) return ignore_malformed(parsed.error().message);
      events.on_straggler(parsed->what);
    } else if (type == "barrier_done" && events.on_barrier_done) {
      auto parsed = parse_barrier_done(message);
      if (!parsed) return ignore_malformed(parsed.error().message);
      events.on_barrier_done(parsed->name);
    }
  };
  replay_early_messages();
}

void RendezvousClient::replay_early_messages() {
  if (early_.empty()) return;
  asio::post(io_, [this, alive = alive_, early = std::exchange(early_, {})] {
    for (const nlohmann::json& message : early)
      if (*alive && on_message_) on_message_(message);
  });
}

void RendezvousClient::ignore_malformed(const std::string& reason) const {
  spdlog::error("the rendezvous at {} sent a malformed {}; ignoring it", endpoint_, reason);
}

void RendezvousClient::report_failure(const std::string& reason, int exit_code) {
  send({{"type", "failed"}, {"reason", reason}, {"exit_code", exit_code}});
  failure_reported_ = true;
  flush(kReportFlushTimeout);
}

void RendezvousClient::await_failure_noted(std::chrono::milliseconds limit) {
  if (failure_reported_)
    run_until(
        io_, [&] { return failure_noted_ || closed_; }, limit);
}

void RendezvousClient::report_done() {
  send({{"type", "done"}});
  flush(kReportFlushTimeout);
}

void RendezvousClient::send(const nlohmann::json& message) {
  if (closed_) return;
  std::string frame = encode_frame(message);
  if (reconnecting_ || !connection_) return hold(std::move(frame));  // Sent after the rejoin.
  connection_->send_frame(std::move(frame));
}

void RendezvousClient::hold(std::string frame) {
  const size_t limit = kUnmeteredLimits.max_queued_bytes;
  if (held_bytes_ + frame.size() > limit) {
    spdlog::error(
        "the rendezvous at {} is unreachable and {} bytes wait for it; dropping a message",
        endpoint_, held_bytes_);
    return;
  }
  held_bytes_ += frame.size();
  held_.push_back(std::move(frame));
}

void RendezvousClient::flush(std::chrono::milliseconds limit) {
  run_until(
      io_, [this] { return closed_ || (!reconnecting_ && connection_ && !connection_->writing()); },
      limit);
}

void RendezvousClient::connection_lost() {
  if (reconnecting_ || closed_) return;
  // A frame cut mid-write would corrupt the new stream; whole frames queued behind it are kept.
  std::deque<std::string> unwritten = connection_->take_unwritten();
  if (!assignment_ && lease_.is_null()) {
    closed_ = true;
    if (on_message_) on_message_({{"type", "lost"}, {"node", "the rendezvous at " + endpoint_}});
    return;
  }
  spdlog::warn(
      "lost the rendezvous at {}; the workers keep running while this node reconnects "
      "(up to {} s)",
      endpoint_, kReconnectTimeout.count());
  reconnecting_ = true;
  heartbeating_ = false;
  heartbeat_timer_.cancel();
  for (std::string& frame : unwritten) hold(std::move(frame));
  reconnect_deadline_ = Clock::now() + kReconnectTimeout;
  try_reconnect(kReconnectBackoffStart);
}

void RendezvousClient::try_reconnect(std::chrono::milliseconds backoff) {
  reconnect_timer_.expires_after(backoff);
  reconnect_timer_.async_wait([this, backoff, alive = alive_](boost::system::error_code ec) {
    if (!*alive || ec) return;
    if (!connect()) {
      if (Clock::now() < reconnect_deadline_)
        return try_reconnect(std::min(backoff * 2, kReconnectBackoffMax));
      spdlog::error("the rendezvous at {} stayed unreachable for {} s", endpoint_,
                    kReconnectTimeout.count());
      reconnecting_ = false;
      closed_ = true;
      held_.clear();
      held_bytes_ = 0;
      if (on_message_) on_message_({{"type", "lost"}, {"node", "the rendezvous at " + endpoint_}});
      return;
    }
    nlohmann::json rejoin = lease_;  // A lease holder re-registers the GPUs and port it holds.
    if (assignment_) {
      rejoin = join_;
      rejoin["type"] = "rejoin";
      rejoin["assignment"] = {{"group_rank", assignment_->group_rank},
                              {"group_world_size", assignment_->group_world_size},
                              {"world_size", assignment_->world_size},
                              {"rank_offset", assignment_->rank_offset},
                              {"master_addr", assignment_->master_addr},
                              {"master_port", assignment_->master_port}};
      spdlog::info("reconnected to the rendezvous at {}; re-registering node rank {}", endpoint_,
                   assignment_->group_rank);
    } else {
      spdlog::info("reconnected to rendezvousd at {}; re-registering this job's GPU lease",
                   endpoint_);
    }
    reconnecting_ = false;
    connection_->send(rejoin);
    for (std::string& frame : std::exchange(held_, {})) connection_->send_frame(std::move(frame));
    held_bytes_ = 0;
    heartbeat();
  });
}

void RendezvousClient::heartbeat() {
  if (heartbeating_) return;
  heartbeating_ = true;
  beat();
}

void RendezvousClient::take_pace(const nlohmann::json& message) {
  if (!message.is_object() || !message.contains("heartbeat_interval_ms")) return;
  auto pace = parse_pace(message);
  if (!pace) return ignore_malformed(pace.error().message);
  heartbeat_interval_ = std::chrono::milliseconds(pace->heartbeat_interval_ms);
  // A faster pace starts now: a beat armed at the old one could come after the daemon gives up.
  if (heartbeating_ && heartbeat_timer_.expiry() > Clock::now() + heartbeat_interval_)
    arm_heartbeat();
}

void RendezvousClient::beat() {
  send({{"type", "heartbeat"}});
  arm_heartbeat();
}

void RendezvousClient::arm_heartbeat() {
  heartbeat_timer_.expires_after(heartbeat_interval_);
  heartbeat_timer_.async_wait([this, alive = alive_](boost::system::error_code ec) {
    if (*alive && !ec && !closed_) beat();
  });
}

}  // namespace mcprun
