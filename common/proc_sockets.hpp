// TCP sockets and their owners, read from /proc: which of a process's connections go to a given
// port (how an agent tells which store connection belongs to which of its ranks: the store
// protocol carries no rank), and which process listens on a port (the doctor's master-port check).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mcprun {

/// A connection's local end, as the server sees it as the client.
struct SocketEnd {
  std::string address;
  int port = 0;
  bool operator==(const SocketEnd&) const = default;
};

/// The local ends of the established TCP connections to `remote_port` held by `pid` or by any
/// process of its process group (a worker's children share its group).
std::vector<SocketEnd> connections_to_port(pid_t pid, int remote_port);

/// An established TCP connection and the bytes in its send queue: written by the process and
/// not yet acknowledged by the peer (on a slow link, what the link has not carried yet).
struct QueuedConnection {
  SocketEnd local, remote;
  uint64_t send_queue = 0;
};

/// `pid`'s own established TCP connections, IPv4 and IPv6, in its network namespace.
std::vector<QueuedConnection> send_queues(pid_t pid);

/// What holds a listening TCP socket.
struct PortListener {
  std::optional<pid_t> pid;  ///< nullopt: the socket's owner is hidden from this user.
  std::string command;       ///< /proc/PID/comm: "python3".
};

/// Who listens on TCP `port` (IPv4 or IPv6) in this network namespace; nullopt when nothing does.
std::optional<PortListener> listener_on_port(int port);

}  // namespace mcprun
