// What the host must allow a server that holds one connection per rank or per agent: open
// descriptors and the listen backlog. Both are checked before serving, and each shortfall is one
// line naming the limit and how to raise it, rather than a refused connect or a reset later.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace mcprun {

/// The listen backlog mcprun's servers ask for. The kernel caps any backlog at
/// net.core.somaxconn, so asking for more costs nothing and takes whatever that is raised to.
inline constexpr int kListenBacklog = 65535;

/// Descriptors a server needs besides one per connection: its listeners, the event loop's, logs.
inline constexpr long kServerSpareDescriptors = 64;

/// The host's limits on holding connections.
struct ConnectionLimits {
  long descriptors = 0;  ///< RLIMIT_NOFILE's soft limit, once raised to the hard one.
  long somaxconn = 0;    ///< net.core.somaxconn, the kernel's cap on a listen backlog; 0: unknown.
};

/// net.core.somaxconn from /proc/sys; 0 when it cannot be read.
long read_somaxconn();

/// This host's limits, `descriptors` being the soft RLIMIT_NOFILE already raised.
ConnectionLimits host_connection_limits(long descriptors);

/// One line: `what` (e.g. "rendezvousd's max_connections 17408") needs more than `limits`
/// allow `connections` arriving at once, each limit short of it, and how to raise it; nullopt
/// when they suffice. `backlog` is what the server asks listen() for.
std::optional<std::string> connection_limits_warning(std::string_view what, size_t connections,
                                                     long backlog, const ConnectionLimits& limits);

}  // namespace mcprun
