// The local agent's unix socket for the workers' python helper (worker_helper/mcprun): heartbeats
// and cross-node barriers. Frames are common/protocol.hpp's. Messages, worker -> agent:
//   hello      rank, pid: sent once per connection
//   heartbeat  (no fields)
//   barrier    name, timeout_s: the caller blocks until the agent answers "barrier_done" {name}
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>

namespace mcprun {

/// What the workers told the agent, on the io thread.
struct ChannelListener {
  std::function<void(int rank)> on_heartbeat;
  std::function<void(int rank, const std::string& name, double timeout_s)> on_barrier;
};

class ChannelSession;

class AgentChannel {
 public:
  /// Listens on `path` (mode 0600); throws boost::system::system_error naming the failure.
  AgentChannel(boost::asio::io_context& io, std::filesystem::path path, ChannelListener listener);
  ~AgentChannel();
  AgentChannel(const AgentChannel&) = delete;
  AgentChannel& operator=(const AgentChannel&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// Answers every worker waiting at barrier `name`.
  void complete_barrier(const std::string& name);

  // Called by sessions.
  const ChannelListener& listener() const { return listener_; }
  void on_closed(const std::shared_ptr<ChannelSession>& session) { sessions_.erase(session); }

 private:
  void accept();

  boost::asio::local::stream_protocol::acceptor acceptor_;
  std::filesystem::path path_;
  ChannelListener listener_;
  std::set<std::shared_ptr<ChannelSession>> sessions_;
};

}  // namespace mcprun
