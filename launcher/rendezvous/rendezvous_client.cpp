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
      client_->on_message_(decode_rendezvous_message(message));
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

namespace {

/// The type a decoded message had on the wire, for a line about an unexpected one.
std::string type_of(const RendezvousMessage& message) {
  return std::visit([](const auto& typed) { return message_type(encode(typed)); }, message);
}

}  // namespace

Expected<Assignment> RendezvousClient::join(JoinMessage join, std::chrono::milliseconds limit) {
  if (auto connected = connect(); !connected) return connected.error();
  if (join.addr.empty()) join.addr = local_address();
  const bool show_progress = ::isatty(STDERR_FILENO);  // A CI log gets no redraws.
  join.progress = show_progress;
  join.assignment.reset();
  join_ = join;
  std::optional<Incoming> reply;
  bool progress_shown = false;
  on_message_ = [&](Incoming incoming) {
    if (incoming && std::holds_alternative<JoinedMessage>(*incoming)) return heartbeat();
    if (incoming && std::holds_alternative<ProgressMessage>(*incoming)) {
      if (!show_progress) return;
      const auto& progress = std::get<ProgressMessage>(*incoming);
      const int min = progress.min_nodes, max = progress.max_nodes;
      std::string names;
      for (const auto& name : progress.names) names += (names.empty() ? "" : ", ") + name;
      std::fprintf(
          stderr, "\rmcprun: %d/%s nodes joined: %s; waiting %.0f s more\x1b[K", progress.joined,
          (min == max ? std::to_string(max) : std::to_string(min) + ".." + std::to_string(max))
              .c_str(),
          names.c_str(), progress.remaining_s);
      progress_shown = true;
      return;
    }
    if (!reply)
      reply = std::move(incoming);
    else if (incoming)
      early_.push_back(std::move(*incoming));  // Read with the assignment, before watch().
  };
  send(join);
  const bool answered = run_until(
      io_, [&] { return reply.has_value() || closed_; }, limit);
  on_message_ = nullptr;  // It refers to this frame's locals.
  if (progress_shown) std::fputc('\n', stderr);
  if (!answered)
    return Error{"no rendezvous assignment within " + std::to_string(limit.count() / 1000) + " s"};
  if (!reply) return Error{"the rendezvous at " + endpoint_ + " closed the connection"};
  if (!*reply) return Error{"rendezvous: " + reply->error().message};
  return std::visit(
      MessageHandlers{[&](const AssignmentMessage& assignment) -> Expected<Assignment> {
                        assignment_ =
                            Assignment{assignment.group_rank,  assignment.group_world_size,
                                       assignment.world_size,  assignment.rank_offset,
                                       assignment.master_addr, assignment.master_port};
                        return *assignment_;
                      },
                      [&](const LostNotice&) -> Expected<Assignment> {
                        return Error{"the rendezvous at " + endpoint_ + " closed the connection"};
                      },
                      [&](const ErrorMessage& refused) -> Expected<Assignment> {
                        return Error{"rendezvous: " + refused.message};
                      },
                      [&](const ClosedNotice& closed) -> Expected<Assignment> {
                        job_closed_ = closed.message;
                        return Error{"rendezvous: " + closed.message};
                      },
                      [&](const auto& other) -> Expected<Assignment> {
                        return Error{"rendezvous: unexpected reply '" + type_of(other) + "'"};
                      }},
      **reply);
}

Expected<GrantedLease> RendezvousClient::lease(LeaseRequest request,
                                               std::chrono::milliseconds limit) {
  if (auto connected = connect(); !connected) return connected.error();
  std::optional<Incoming> reply;
  on_message_ = [&](Incoming incoming) {
    if (incoming && std::holds_alternative<QueuedNotice>(*incoming))
      return spdlog::info("waiting up to {:g} s for a GPU lease: {}", request.wait_s,
                          std::get<QueuedNotice>(*incoming).message);
    if (!reply) reply = std::move(incoming);
  };
  send(request);
  const bool answered = run_until(
      io_, [&] { return reply.has_value() || closed_; }, limit);
  on_message_ = nullptr;  // It refers to this frame's locals.
  if (!answered)
    return Error{"rendezvousd at " + endpoint_ + " did not answer the lease request within " +
                 std::to_string(limit.count() / 1000) + " s"};
  if (!reply) return Error{"rendezvousd at " + endpoint_ + " closed the connection"};
  if (!*reply) return Error{"rendezvousd sent a " + reply->error().message};
  if (const auto* refused = std::get_if<ErrorMessage>(&**reply)) return Error{refused->message};
  const auto* grant = std::get_if<LeaseGrant>(&**reply);
  if (!grant)
    return Error{"rendezvousd answered the lease request with '" + type_of(**reply) + "'"};
  heartbeat();  // The lease lasts as long as this connection does.
  request.held = HeldLease{grant->gpus, grant->port};
  lease_ = request;
  return GrantedLease{grant->gpus, grant->port};
}

void RendezvousClient::watch(PeerEvents events) {
  auto stopped = std::make_shared<bool>(false);
  auto stop_once = [on_stop = events.on_stop, stopped](const PeerStop& stop) {
    if (!*stopped && on_stop) {
      *stopped = true;
      on_stop(stop);
    }
  };
  on_message_ = [this, stop_once, events](Incoming incoming) {
    if (!incoming) return ignore_malformed(incoming.error().message);
    std::visit(
        MessageHandlers{
            [&](const FailedNotice& failed) {
              stop_once({"node " + (failed.node.empty() ? "?" : failed.node) + ": " + failed.reason,
                         failed.exit_code, false, failed.preflight});
            },
            [&](const MembershipNotice& joins) {
              stop_once({"node " + joins.node + " joins the job; re-forming the round",
                         kExitRendezvous, true});
            },
            [&](const LostNotice& lost) {
              stop_once({lost.node + " was lost (it stopped answering)", kExitRendezvous});
            },
            [&](const FailureNoted&) { failure_noted_ = true; },
            [&](const ClosedNotice& closed) { job_closed_ = closed.message; },
            [&](const StallMessage& stall) {
              if (events.on_stall) events.on_stall(stall.body);
            },
            [&](const StallReportMessage& report) {
              if (events.on_stall_report) events.on_stall_report(report.node, report.ranks);
            },
            [&](const StragglerMessage& straggler) {
              if (events.on_straggler) events.on_straggler(straggler.line);
            },
            [&](const BarrierDone& done) {
              if (events.on_barrier_done) events.on_barrier_done(done.name);
            },
            [](const auto&) {}},  // The pace was taken; the rest concerns a forming round.
        *incoming);
  };
  replay_early_messages();
}

void RendezvousClient::replay_early_messages() {
  if (early_.empty()) return;
  asio::post(io_, [this, alive = alive_, early = std::exchange(early_, {})] {
    for (const RendezvousMessage& message : early)
      if (*alive && on_message_) on_message_(message);
  });
}

void RendezvousClient::ignore_malformed(const std::string& reason) const {
  spdlog::error("the rendezvous at {} sent a message it cannot use ({}); ignoring it", endpoint_,
                reason);
}

void RendezvousClient::report_failure(const std::string& reason, int exit_code,
                                      nlohmann::json preflight) {
  send(FailedNotice{"", reason, exit_code, std::move(preflight)});
  failure_reported_ = true;
  flush(kReportFlushTimeout);
}

void RendezvousClient::await_failure_noted(std::chrono::milliseconds limit) {
  if (failure_reported_)
    run_until(
        io_, [&] { return failure_noted_ || closed_; }, limit);
}

void RendezvousClient::report_done() {
  send(DoneMessage{});
  flush(kReportFlushTimeout);
}

void RendezvousClient::send(const AgentMessage& message) {
  if (closed_) return;
  std::string frame = encode_frame(encode(message));
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
  if (!assignment_ && !lease_) {
    closed_ = true;
    if (on_message_) on_message_(RendezvousMessage(LostNotice{"the rendezvous at " + endpoint_}));
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
      if (on_message_) on_message_(RendezvousMessage(LostNotice{"the rendezvous at " + endpoint_}));
      return;
    }
    AgentMessage rejoin = lease_.value_or(LeaseRequest{});  // A lease holder re-registers it.
    if (assignment_) {
      JoinMessage rejoining = join_;
      rejoining.assignment = AssignmentMessage{
          assignment_->group_rank,  assignment_->group_world_size, assignment_->world_size,
          assignment_->rank_offset, assignment_->master_addr,      assignment_->master_port};
      rejoin = std::move(rejoining);
      spdlog::info("reconnected to the rendezvous at {}; re-registering node rank {}", endpoint_,
                   assignment_->group_rank);
    } else {
      spdlog::info("reconnected to rendezvousd at {}; re-registering this job's GPU lease",
                   endpoint_);
    }
    reconnecting_ = false;
    connection_->send(encode(rejoin));
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
  send(HeartbeatMessage{});
  arm_heartbeat();
}

void RendezvousClient::arm_heartbeat() {
  heartbeat_timer_.expires_after(heartbeat_interval_);
  heartbeat_timer_.async_wait([this, alive = alive_](boost::system::error_code ec) {
    if (*alive && !ec && !closed_) beat();
  });
}

}  // namespace mcprun
