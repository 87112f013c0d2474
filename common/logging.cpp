#include "common/logging.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace mcprun {

void init_logging(const char* program_name, bool verbose) {
  // Colour only on a terminal (spdlog's automatic mode checks isatty and TERM): a CI log or a
  // pipe gets plain text. NO_COLOR (no-color.org) turns it off everywhere.
  const char* no_color = std::getenv("NO_COLOR");
  const auto colour =
      no_color && *no_color ? spdlog::color_mode::never : spdlog::color_mode::automatic;
  // Unsynchronised sink: every binary logs from its single event-loop thread.
  auto logger = spdlog::stderr_color_st(program_name, colour);
  logger->set_pattern(std::string(program_name) + ": %^%l%$: %v");
  logger->set_level(verbose ? spdlog::level::debug : spdlog::level::info);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
}

}  // namespace mcprun
