// rendezvousd's configuration: the YAML file, then command-line overrides.
#pragma once

#include <spdlog/common.h>

#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <optional>
#include <string>

#include "common/endpoint.hpp"
#include "common/expected.hpp"
#include "rendezvous/rendezvous_server.hpp"

namespace mcprun {

/// How long a SIGTERM may take to close every session and exit, unless stop_timeout_s says.
inline constexpr std::chrono::seconds kDefaultStopTimeout{5};

/// Everything the daemon is started with.
struct DaemonConfig {
  std::string listen = "0.0.0.0:29400";
  std::string metrics_listen;  ///< IP:PORT serving GET /metrics; empty: no metrics.
  std::string token_file;
  std::chrono::milliseconds stop_timeout{kDefaultStopTimeout};  ///< Longer: a forced exit (1).
  spdlog::level::level_enum log_level = spdlog::level::info;
  ServerSettings server;
};

/// Reads `path` into `config`; an error line naming the key, its line and what was expected.
Expected<void> load_daemon_config(const std::string& path, DaemonConfig& config);

/// Reads the token file into config.server.token; an error line when unreadable or empty.
Expected<void> load_token(DaemonConfig& config);

}  // namespace mcprun
