// rendezvousd's configuration: the YAML file, then command-line overrides.
#pragma once

#include <optional>
#include <string>

#include "rendezvousd/rendezvous_server.hpp"

namespace mcprun {

/// Everything the daemon is started with.
struct DaemonConfig {
  std::string listen = "0.0.0.0:29400";
  std::string token_file;
  ServerSettings server;
};

/// Reads `path` into `config`; an error line naming the key, its line and what was expected.
std::optional<std::string> load_daemon_config(const std::string& path, DaemonConfig& config);

/// Reads the token file into config.server.token; an error line when unreadable or empty.
std::optional<std::string> load_token(DaemonConfig& config);

}  // namespace mcprun
