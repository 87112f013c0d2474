#include "common/logging.hpp"

#include <spdlog/sinks/stdout_sinks.h>

namespace mcprun {

void init_logging(const char* program_name, bool verbose) {
  // Unsynchronised sink: every binary logs from its single event-loop thread.
  auto logger = spdlog::stderr_logger_st(program_name);
  logger->set_pattern(std::string(program_name) + ": %^%l%$: %v");
  logger->set_level(verbose ? spdlog::level::debug : spdlog::level::info);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
}

}  // namespace mcprun
