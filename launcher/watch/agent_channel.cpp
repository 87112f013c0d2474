#include "launcher/watch/agent_channel.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include "common/framed_session.hpp"
#include "common/logging.hpp"
#include "common/messages.hpp"

namespace mcprun {

namespace asio = boost::asio;
using local = asio::local::stream_protocol;

/// One worker process's connection. A worker may call mcprun.heartbeat() once per step, however
/// short its steps: the job's own processes get no message-rate cap, only the caps on frames and
/// on answers they leave unread.
class ChannelSession : public FramedSession {
 public:
  ChannelSession(local::socket socket, AgentChannel& channel)
      : FramedSession(Socket(std::move(socket)), "a worker's helper connection", kUnmeteredLimits),
        channel_(channel) {}

  /// Replies to a pending barrier(name) call, if this worker is waiting at it.
  void complete_barrier(const std::string& name) {
    if (!waiting_at_.erase(name)) return;
    send(encode(BarrierDone{name}));
  }

 private:
  void on_frame(const nlohmann::json& message) override {
    auto decoded = decode_worker_message(message);
    if (!decoded) return refuse(decoded.error().message);
    const ChannelListener& listener = channel_.listener();
    std::visit(MessageHandlers{[&](const HelloMessage& hello) {
                                 rank_ = hello.rank;
                                 set_peer("rank " + std::to_string(rank_) + "'s helper");
                               },
                               [&](const HeartbeatMessage&) {
                                 if (listener.on_heartbeat && rank_ >= 0)
                                   listener.on_heartbeat(rank_);
                               },
                               [&](const BarrierRequest& barrier) {
                                 waiting_at_.insert(barrier.name);
                                 if (listener.on_barrier && rank_ >= 0)
                                   listener.on_barrier(rank_, barrier.name, barrier.timeout_s);
                               }},
               *decoded);
  }

  /// A malformed or unknown message closes this worker's connection: the helper that ships with
  /// this mcprun sends neither, so the peer is broken; the helper raises, the job goes on.
  void refuse(const std::string& reason) {
    spdlog::warn("{} sent a malformed message ({}); closing it", peer(), reason);
    close();
  }

  void on_closed() override {
    channel_.on_closed(std::static_pointer_cast<ChannelSession>(shared_from_this()));
  }

  AgentChannel& channel_;
  std::set<std::string> waiting_at_;
  int rank_ = -1;
};

AgentChannel::AgentChannel(asio::io_context& io, std::filesystem::path path,
                           ChannelListener listener)
    : acceptor_(io), path_(std::move(path)), listener_(std::move(listener)) {
  ::unlink(path_.c_str());
  acceptor_.open();
  acceptor_.bind(local::endpoint(path_.string()));
  ::chmod(path_.c_str(), S_IRUSR | S_IWUSR);  // Only the job's own user talks to its agent.
  acceptor_.listen();
  accept();
}

AgentChannel::~AgentChannel() {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  for (auto session : std::set(sessions_)) session->close();
  ::unlink(path_.c_str());
}

void AgentChannel::accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, local::socket socket) {
    if (ec) return;  // Closed: the agent is shutting down.
    auto session = std::make_shared<ChannelSession>(std::move(socket), *this);
    sessions_.insert(session);
    session->start(std::chrono::milliseconds::zero());  // A worker may be quiet for hours.
    accept();
  });
}

void AgentChannel::complete_barrier(const std::string& name) {
  for (auto session : std::set(sessions_)) session->complete_barrier(name);
}

}  // namespace mcprun
