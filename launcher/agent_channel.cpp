#include "launcher/agent_channel.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/write.hpp>
#include <array>
#include <deque>

#include "common/logging.hpp"
#include "common/protocol.hpp"

namespace mcprun {

namespace asio = boost::asio;
using local = asio::local::stream_protocol;

/// One worker process's connection.
class ChannelSession : public std::enable_shared_from_this<ChannelSession> {
 public:
  ChannelSession(local::socket socket, AgentChannel& channel)
      : socket_(std::move(socket)), channel_(channel) {}

  void start() { read(); }

  /// Replies to a pending barrier(name) call, if this worker is waiting at it.
  void complete_barrier(const std::string& name) {
    if (!waiting_at_.erase(name)) return;
    const bool idle = writes_.empty();
    writes_.push_back(encode_frame({{"type", "barrier_done"}, {"name", name}}));
    if (idle) write_next();
  }

  void close() {
    if (closed_) return;  // Queued handlers may still call it after the channel closed us.
    closed_ = true;
    boost::system::error_code ignored;
    socket_.close(ignored);
    channel_.on_closed(shared_from_this());
  }

 private:
  void read() {
    socket_.async_read_some(asio::buffer(chunk_), [self = shared_from_this()](
                                                      boost::system::error_code ec, size_t n) {
      if (ec) return self->close();
      self->buffer_.append(self->chunk_.data(), n);
      if (self->drain_frames()) self->read();
    });
  }

  /// Handles every whole frame buffered; false once the session is closed.
  bool drain_frames() {
    for (;;) {
      FrameResult result = decode_frame(buffer_);
      if (std::holds_alternative<FrameIncomplete>(result)) return true;
      if (auto* error = std::get_if<FrameError>(&result)) {
        spdlog::warn("worker helper connection sent a bad frame: {}; closing it", error->message);
        close();
        return false;
      }
      Frame& frame = std::get<Frame>(result);
      buffer_.erase(0, frame.consumed);
      handle(frame.message);
    }
  }

  void handle(const nlohmann::json& message) {
    const std::string type = message["type"];
    const ChannelListener& listener = channel_.listener();
    if (type == "hello") {
      rank_ = message.value("rank", -1);
    } else if (type == "heartbeat") {
      if (listener.on_heartbeat && rank_ >= 0) listener.on_heartbeat(rank_);
    } else if (type == "barrier") {
      const std::string name = message.value("name", std::string());
      waiting_at_.insert(name);
      if (listener.on_barrier && rank_ >= 0)
        listener.on_barrier(rank_, name, message.value("timeout_s", 0.0));
    } else {
      spdlog::warn("rank {}'s helper sent an unknown message '{}'", rank_, type);
    }
  }

  void write_next() {
    asio::async_write(socket_, asio::buffer(writes_.front()),
                      [self = shared_from_this()](boost::system::error_code ec, size_t) {
                        if (ec) return self->close();
                        self->writes_.pop_front();
                        if (!self->writes_.empty()) self->write_next();
                      });
  }

  local::socket socket_;
  AgentChannel& channel_;
  std::array<char, 4096> chunk_;
  std::string buffer_;
  std::deque<std::string> writes_;
  std::set<std::string> waiting_at_;
  int rank_ = -1;
  bool closed_ = false;
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
    session->start();
    accept();
  });
}

void AgentChannel::complete_barrier(const std::string& name) {
  for (auto session : std::set(sessions_)) session->complete_barrier(name);
}

}  // namespace mcprun
