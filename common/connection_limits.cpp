#include "common/connection_limits.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <vector>

namespace mcprun {

long read_somaxconn() {
  std::ifstream in("/proc/sys/net/core/somaxconn");
  long value = 0;
  return in >> value ? value : 0;
}

ConnectionLimits host_connection_limits(long descriptors) {
  return ConnectionLimits{descriptors, read_somaxconn()};
}

std::optional<std::string> connection_limits_warning(std::string_view what, size_t connections,
                                                     long backlog, const ConnectionLimits& limits) {
  const long wanted = static_cast<long>(connections);
  std::vector<std::string> short_of;
  if (const long needed = wanted + kServerSpareDescriptors; limits.descriptors < needed)
    short_of.push_back(
        fmt::format("ulimit -n is {} (raise the hard limit to {} or more: "
                    "LimitNOFILE= in a unit, nofile in limits.conf)",
                    limits.descriptors, needed));
  // A backlog shorter than the connections that arrive at once drops SYNs: clients retry after
  // a second, or see a reset where tcp_abort_on_overflow is set.
  const long effective = limits.somaxconn > 0 ? std::min(backlog, limits.somaxconn) : backlog;
  if (effective < wanted) {
    if (backlog < wanted)
      short_of.push_back(fmt::format("the listen backlog asked for is {}", backlog));
    if (limits.somaxconn > 0 && limits.somaxconn < wanted)
      short_of.push_back(fmt::format("net.core.somaxconn is {} (sysctl -w net.core.somaxconn={})",
                                     limits.somaxconn, wanted));
  }
  if (short_of.empty()) return std::nullopt;
  return fmt::format("{} needs more than this host allows {} connections at once: {}", what,
                     connections, fmt::join(short_of, "; "));
}

}  // namespace mcprun
