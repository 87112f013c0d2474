// `mcprun jobs`, `mcprun status ID [--json]`, `mcprun stop ID`: an operator's view of the jobs a
// rendezvousd serves, over its unix socket (who you are comes from SO_PEERCRED) or over TCP with
// its token.
#pragma once

#include <string>
#include <vector>

namespace mcprun {

/// Runs one operator subcommand; `args` starts with its name. Returns the exit code.
int run_operator_command(const std::vector<std::string>& args);

}  // namespace mcprun
