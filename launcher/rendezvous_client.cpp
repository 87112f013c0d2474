#include "launcher/rendezvous_client.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/write.hpp>
#include <unistd.h>

#include <cstdio>
#include <optional>

#include "common/event_loop.hpp"
#include "common/exit_status.hpp"
#include "common/logging.hpp"
#include "common/protocol.hpp"

namespace mcprun {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;


RendezvousClient::RendezvousClient(asio::io_context& io, std::string endpoint)
    : io_(io), endpoint_(std::move(endpoint)), socket_(io), heartbeat_timer_(io), reconnect_timer_(io) {}

RendezvousClient::~RendezvousClient() {
  *alive_ = false;
  boost::system::error_code ignored;
  heartbeat_timer_.cancel();
  reconnect_timer_.cancel();
  socket_.close(ignored);
}

std::string RendezvousClient::local_address() const { return local_address_; }

std::optional<std::string> RendezvousClient::connect() {
  boost::system::error_code ec;
  if (endpoint_.rfind("unix:", 0) == 0) {
    asio::local::stream_protocol::socket local(io_);
    local.connect(asio::local::stream_protocol::endpoint(endpoint_.substr(5)), ec);
    if (ec) return "cannot reach rendezvous at " + endpoint_ + ": " + ec.message();
    socket_ = asio::generic::stream_protocol::socket(std::move(local));
    local_address_ = "127.0.0.1";  // The daemon's host is this host.
    return std::nullopt;
  }
  auto colon = endpoint_.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return "--rdzv-endpoint " + endpoint_ + ": expected HOST:PORT or unix:PATH";
  const std::string host = endpoint_.substr(0, colon), port = endpoint_.substr(colon + 1);
  tcp::resolver resolver(io_);
  auto addresses = resolver.resolve(host, port, ec);
  if (ec) return "cannot resolve rendezvous endpoint " + endpoint_ + ": " + ec.message();

  tcp::socket socket(io_);
  std::optional<boost::system::error_code> connected;
  asio::async_connect(socket, addresses,
                      [&](boost::system::error_code result, const tcp::endpoint&) { connected = result; });
  if (!run_until(io_, [&] { return connected.has_value(); }, kRendezvousConnectTimeout)) {
    socket.close(ec);
    run_until(io_, [&] { return connected.has_value(); }, std::chrono::seconds(1));
    return "rendezvous endpoint " + endpoint_ + " did not answer within " +
           std::to_string(kRendezvousConnectTimeout.count()) + " s";
  }
  if (*connected)
    return "cannot reach rendezvous at " + endpoint_ + ": " + connected->message() +
           " (is rendezvousd running there?)";
  local_address_ = socket.local_endpoint(ec).address().to_string();
  socket_ = asio::generic::stream_protocol::socket(std::move(socket));
  return std::nullopt;
}

std::variant<Assignment, std::string> RendezvousClient::join(nlohmann::json join,
                                                            std::chrono::milliseconds limit) {
  if (auto error = connect()) return *error;
  if (!join.contains("addr") || join["addr"].get<std::string>().empty()) join["addr"] = local_address();
  join["type"] = "join";
  join_ = join;
  std::optional<nlohmann::json> reply;
  const bool show_progress = ::isatty(STDERR_FILENO);  // A CI log gets no redraws.
  bool progress_shown = false;
  on_message_ = [&](const nlohmann::json& message) {
    if (message["type"] == "joined") {
      heartbeat_interval_ = std::chrono::milliseconds(
          message.value("heartbeat_interval_ms", kDefaultHeartbeatInterval.count()));
      heartbeat();
    } else if (message["type"] == "progress") {
      if (!show_progress) return;
      const int min = message.value("min_nodes", 0), max = message.value("max_nodes", 0);
      std::string names;
      for (const auto& name : message.value("names", std::vector<std::string>{}))
        names += (names.empty() ? "" : ", ") + name;
      std::fprintf(stderr, "\rmcprun: %zu/%s nodes joined: %s; waiting %.0f s more\x1b[K",
                   message.value("joined", size_t{0}),
                   (min == max ? std::to_string(max) : std::to_string(min) + ".." + std::to_string(max)).c_str(),
                   names.c_str(), message.value("remaining_s", 0.0));
      progress_shown = true;
    } else if (!reply) {
      reply = message;
    }
  };
  send(join);
  read();
  const bool answered = run_until(io_, [&] { return reply.has_value() || closed_; }, limit);
  on_message_ = nullptr;  // It refers to this frame's locals.
  if (progress_shown) std::fputc('\n', stderr);
  if (!answered)
    return "no rendezvous assignment within " + std::to_string(limit.count() / 1000) + " s";
  if (!reply) return "the rendezvous at " + endpoint_ + " closed the connection";
  const nlohmann::json message = *reply;
  if (message["type"] == "lost") return "the rendezvous at " + endpoint_ + " closed the connection";
  if (message["type"] == "error") return "rendezvous: " + message.value("message", std::string("refused"));
  if (message["type"] != "assignment") return "rendezvous: unexpected reply " + message.dump();
  try {
    assignment_ = Assignment{message.at("group_rank"), message.at("group_world_size"),
                             message.at("world_size"), message.at("rank_offset"),
                             message.at("master_addr"), message.at("master_port")};
    return *assignment_;
  } catch (const nlohmann::json::exception& error) {
    return std::string("rendezvous: malformed assignment: ") + error.what();
  }
}

std::variant<GrantedLease, std::string> RendezvousClient::lease(nlohmann::json request,
                                                               std::chrono::milliseconds limit) {
  if (auto error = connect()) return *error;
  request["type"] = "lease";
  std::optional<nlohmann::json> reply;
  on_message_ = [&](const nlohmann::json& message) {
    if (message["type"] == "queued")
      spdlog::info("waiting up to {:g} s for a GPU lease: {}", request.value("wait_s", 0.0),
                   message.value("message", std::string()));
    else if (!reply)
      reply = message;
  };
  send(request);
  read();
  const bool answered = run_until(io_, [&] { return reply.has_value() || closed_; }, limit);
  on_message_ = nullptr;  // It refers to this frame's locals.
  if (!answered)
    return "rendezvousd at " + endpoint_ + " did not answer the lease request within " +
           std::to_string(limit.count() / 1000) + " s";
  if (!reply) return "rendezvousd at " + endpoint_ + " closed the connection";
  if ((*reply)["type"] == "error") return reply->value("message", std::string("lease refused"));
  heartbeat_interval_ = std::chrono::milliseconds(
      reply->value("heartbeat_interval_ms", kDefaultHeartbeatInterval.count()));
  heartbeat();  // The lease lasts as long as this connection does.
  GrantedLease granted{reply->value("gpus", std::vector<std::string>{}), reply->value("port", 0)};
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
  on_message_ = [stop_once, events](const nlohmann::json& message) {
    const std::string type = message["type"];
    if (type == "failed")
      stop_once({"node " + message.value("node", std::string("?")) + ": " +
                     message.value("reason", std::string("a worker failed")),
                 message.value("exit_code", static_cast<int>(kExitFailure))});
    else if (type == "membership")
      stop_once({"node " + message.value("node", std::string("?")) +
                     " joins the job; re-forming the round",
                 kExitRendezvous, true});
    else if (type == "lost")
      stop_once({message.value("node", std::string("?")) + " was lost (it stopped answering)",
                 kExitRendezvous});
    else if (type == "stall" && events.on_stall)
      events.on_stall(message);
    else if (type == "stall_report" && events.on_stall_report)
      events.on_stall_report(message);
    else if (type == "barrier_done" && events.on_barrier_done)
      events.on_barrier_done(message.value("name", std::string()));
  };
}

void RendezvousClient::report_failure(const std::string& reason, int exit_code) {
  send({{"type", "failed"}, {"reason", reason}, {"exit_code", exit_code}});
  flush(std::chrono::seconds(2));
}

void RendezvousClient::report_done() {
  send({{"type", "done"}});
  flush(std::chrono::seconds(2));
}

void RendezvousClient::send(const nlohmann::json& message) {
  if (closed_) return;
  const bool idle = writes_.empty();
  writes_.push_back(encode_frame(message));  // Held while reconnecting, sent after the rejoin.
  if (idle && !reconnecting_) write_next();
}

void RendezvousClient::write_next() {
  asio::async_write(socket_, asio::buffer(writes_.front()),
                    [this, alive = alive_](boost::system::error_code ec, size_t) {
                      if (!*alive || reconnecting_) return;
                      if (ec) return connection_lost();
                      writes_.pop_front();
                      if (!writes_.empty()) write_next();
                    });
}

void RendezvousClient::flush(std::chrono::milliseconds limit) {
  run_until(io_, [this] { return (writes_.empty() && !reconnecting_) || closed_; }, limit);
}

void RendezvousClient::read() {
  socket_.async_read_some(asio::buffer(chunk_), [this, alive = alive_](boost::system::error_code ec,
                                                                      size_t n) {
    if (!*alive || reconnecting_) return;
    if (ec) {
      if (ec != asio::error::operation_aborted) connection_lost();
      return;
    }
    buffer_.append(chunk_.data(), n);
    for (;;) {
      FrameResult result = decode_frame(buffer_);
      if (auto* frame = std::get_if<Frame>(&result)) {
        buffer_.erase(0, frame->consumed);
        if (on_message_) on_message_(frame->message);
        continue;
      }
      if (auto* error = std::get_if<FrameError>(&result)) {
        spdlog::error("rendezvous sent a bad frame: {}", error->message);
        closed_ = true;
        return;
      }
      break;
    }
    read();
  });
}

void RendezvousClient::connection_lost() {
  if (reconnecting_ || closed_) return;
  boost::system::error_code ignored;
  socket_.close(ignored);
  if (!assignment_ && lease_.is_null()) {
    closed_ = true;
    writes_.clear();
    if (on_message_) on_message_({{"type", "lost"}, {"node", "the rendezvous at " + endpoint_}});
    return;
  }
  spdlog::warn("lost the rendezvous at {}; the workers keep running while this node reconnects "
               "(up to {} s)", endpoint_, kReconnectTimeout.count());
  reconnecting_ = true;
  heartbeating_ = false;
  heartbeat_timer_.cancel();
  buffer_.clear();
  // A frame cut mid-write would corrupt the new stream; whole frames queued later are kept.
  if (!writes_.empty()) writes_.pop_front();
  reconnect_deadline_ = Clock::now() + kReconnectTimeout;
  try_reconnect(kReconnectBackoffStart);
}

void RendezvousClient::try_reconnect(std::chrono::milliseconds backoff) {
  reconnect_timer_.expires_after(backoff);
  reconnect_timer_.async_wait([this, backoff, alive = alive_](boost::system::error_code ec) {
    if (!*alive || ec) return;
    if (connect()) {
      if (Clock::now() < reconnect_deadline_) return try_reconnect(std::min(backoff * 2, kReconnectBackoffMax));
      spdlog::error("the rendezvous at {} stayed unreachable for {} s", endpoint_, kReconnectTimeout.count());
      reconnecting_ = false;
      closed_ = true;
      writes_.clear();
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
      spdlog::info("reconnected to rendezvousd at {}; re-registering this job's GPU lease", endpoint_);
    }
    reconnecting_ = false;
    writes_.push_front(encode_frame(rejoin));
    write_next();
    read();
    heartbeat();
  });
}

void RendezvousClient::heartbeat() {
  if (heartbeating_) return;
  heartbeating_ = true;
  beat();
}

void RendezvousClient::beat() {
  send({{"type", "heartbeat"}});
  heartbeat_timer_.expires_after(heartbeat_interval_);
  heartbeat_timer_.async_wait([this, alive = alive_](boost::system::error_code ec) {
    if (*alive && !ec && !closed_) beat();
  });
}

}  // namespace mcprun
