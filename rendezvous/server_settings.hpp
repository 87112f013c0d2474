// What a rendezvous server is configured with: rendezvousd's configuration file sets it, an
// embedded server takes the defaults.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/connection_limits.hpp"
#include "common/framed_session.hpp"

namespace mcprun {

/// Limits that keep one bad peer from costing more than its own connection.
struct ServerSettings {
  std::string token;        ///< Empty: no authentication.
  std::string unix_socket;  ///< Also listen here for local agents.
  std::chrono::milliseconds first_message_timeout{std::chrono::seconds(10)};
  std::chrono::milliseconds lease{std::chrono::seconds(15)};  ///< Silence longer than this: lost.
  /// Agents heartbeat at a third of the lease, or slower where the agents held would send more
  /// than this many heartbeats a second in all (16,384 agents: every 16.4 s, lost after 49 s).
  double max_heartbeats_per_second = 1000;
  /// 16,384 agents (one job that size, or several smaller ones) and operators or agents
  /// reconnecting after a daemon restart beside them.
  size_t max_connections = 16384 + 1024;
  int listen_backlog = kListenBacklog;  ///< Asked of listen(); the kernel caps it at somaxconn.
  SessionLimits session_limits;         ///< Per connection: queued output and message rate.
  std::chrono::seconds finished_job_ttl{600};
  std::vector<std::string> label_precedence{"rack", "switch"};
  int lease_port_first = 29500;  ///< Master ports leased to local jobs: [first, last].
  int lease_port_last = 29999;
};

}  // namespace mcprun
