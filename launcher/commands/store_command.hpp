// `mcprun store`: the job's TCPStore server on its own, for init_method=tcp:// jobs and benchmarks.
#pragma once

#include <string>
#include <vector>

namespace mcprun {

/// Runs `mcprun store [flags]` (`args` without "store") until SIGINT or SIGTERM; returns the exit
/// code: 0 after a signal, 1 when it cannot listen, 2 for bad flags.
int run_store_command(const std::vector<std::string>& args);

}  // namespace mcprun
