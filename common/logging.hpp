// One console logger for every mcprun binary, so messages look alike and go to stderr.
#pragma once

#include <spdlog/spdlog.h>

namespace mcprun {

/// Sets the default spdlog logger to "mcprun: <level>: message" on stderr.
void init_logging(const char* program_name, bool verbose);

}  // namespace mcprun
