// Which of a process's TCP connections go to a given port, read from /proc: how an agent tells
// which store connection belongs to which of its ranks (the store protocol carries no rank).
#pragma once

#include <sys/types.h>

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

}  // namespace mcprun
