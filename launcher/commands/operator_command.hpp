// `mcprun jobs`, `mcprun status ID [--json]`, `mcprun stop ID`: an operator's view of the jobs a
// rendezvousd serves, over its unix socket (who you are comes from SO_PEERCRED) or over TCP with
// its token.
#pragma once

#include <string>
#include <vector>

namespace mcprun {

/// Where the systemd unit's rendezvousd listens for local users.
inline constexpr const char* kDefaultDaemonEndpoint = "unix:/run/mcprun/rendezvousd.sock";

/// Runs one operator subcommand; `args` starts with its name. Returns the exit code.
int run_operator_command(const std::vector<std::string>& args);

}  // namespace mcprun
