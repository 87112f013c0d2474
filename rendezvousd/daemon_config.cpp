#include "rendezvousd/daemon_config.hpp"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>

#include "common/endpoint.hpp"

namespace mcprun {
namespace {

std::chrono::milliseconds seconds_to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<long>(seconds * 1000));
}

const std::map<std::string, spdlog::level::level_enum> kLogLevels{{"debug", spdlog::level::debug},
                                                                  {"info", spdlog::level::info},
                                                                  {"warning", spdlog::level::warn},
                                                                  {"error", spdlog::level::err}};

}  // namespace

Expected<void> load_daemon_config(const std::string& path, DaemonConfig& config) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return Error{path + ": cannot read the file"};
  } catch (const YAML::Exception& error) {
    return Error{path + ":" + std::to_string(error.mark.line + 1) +
                 ": not valid YAML: " + error.msg};
  }
  if (root.IsNull()) return {};
  if (!root.IsMap()) return Error{path + ": expected a mapping of keys"};

  using Setter = std::function<void(const YAML::Node&)>;
  auto positive = [](double value) {
    if (!std::isfinite(value) || value <= 0)
      throw YAML::Exception(YAML::Mark::null_mark(), "must be > 0");
    return value;
  };
  auto endpoint = [](const YAML::Node& n) {
    const auto text = n.as<std::string>();
    if (!parse_listen_address(text)) throw YAML::Exception(n.Mark(), "not IP:PORT");
    return text;
  };
  const std::map<std::string, std::pair<std::string, Setter>> keys{
      {"listen", {"IP:PORT", [&](const YAML::Node& n) { config.listen = endpoint(n); }}},
      {"metrics_listen",
       {"IP:PORT or empty",
        [&](const YAML::Node& n) {
          config.metrics_listen = n.IsNull() || n.as<std::string>().empty() ? "" : endpoint(n);
        }}},
      {"unix_socket",
       {"a path", [&](const YAML::Node& n) { config.server.unix_socket = n.as<std::string>(); }}},
      {"token_file",
       {"a path", [&](const YAML::Node& n) { config.token_file = n.as<std::string>(); }}},
      {"lease_s",
       {"seconds > 0",
        [&](const YAML::Node& n) {
          config.server.lease = seconds_to_ms(positive(n.as<double>()));
        }}},
      {"max_heartbeats_per_second",
       {"heartbeats a second > 0",
        [&](const YAML::Node& n) {
          config.server.max_heartbeats_per_second = positive(n.as<double>());
        }}},
      {"first_message_timeout_s",
       {"seconds > 0",
        [&](const YAML::Node& n) {
          config.server.first_message_timeout = seconds_to_ms(positive(n.as<double>()));
        }}},
      {"max_connections",
       {"a count > 0",
        [&](const YAML::Node& n) {
          config.server.max_connections = static_cast<size_t>(positive(n.as<int>()));
        }}},
      {"listen_backlog",
       {"a count > 0",
        [&](const YAML::Node& n) {
          config.server.listen_backlog = static_cast<int>(positive(n.as<int>()));
        }}},
      {"max_queued_bytes",
       {"a byte count >= " + std::to_string(kMinQueuedBytes) + " (one largest frame)",
        [&](const YAML::Node& n) {
          const auto bytes = n.as<long long>();
          if (bytes < static_cast<long long>(kMinQueuedBytes))
            throw YAML::Exception(n.Mark(), "too small");
          config.server.session_limits.max_queued_bytes = static_cast<size_t>(bytes);
        }}},
      {"messages_per_second",
       {"messages a second > 0",
        [&](const YAML::Node& n) {
          config.server.session_limits.messages_per_second = positive(n.as<double>());
        }}},
      {"message_burst",
       {"a message count >= 1",
        [&](const YAML::Node& n) {
          const double burst = n.as<double>();
          if (!std::isfinite(burst) || burst < 1) throw YAML::Exception(n.Mark(), "below 1");
          config.server.session_limits.message_burst = burst;
        }}},
      {"finished_job_ttl_s",
       {"seconds > 0",
        [&](const YAML::Node& n) {
          config.server.finished_job_ttl =
              std::chrono::seconds(static_cast<long>(positive(n.as<double>())));
        }}},
      {"label_precedence",
       {"a list of label names",
        [&](const YAML::Node& n) {
          config.server.label_precedence = n.as<std::vector<std::string>>();
        }}},
      {"stop_timeout_s",
       {"seconds > 0",
        [&](const YAML::Node& n) {
          config.stop_timeout = seconds_to_ms(positive(n.as<double>()));
        }}},
      {"log_level",
       {"debug, info, warning or error",
        [&](const YAML::Node& n) {
          auto level = kLogLevels.find(n.as<std::string>());
          if (level == kLogLevels.end()) throw YAML::Exception(n.Mark(), "unknown level");
          config.log_level = level->second;
        }}},
  };
  for (const auto& entry : root) {
    const std::string key = entry.first.as<std::string>();
    const std::string where = path + ":" + std::to_string(entry.first.Mark().line + 1);
    auto it = keys.find(key);
    if (it == keys.end()) return Error{where + ": unknown key '" + key + "'"};
    try {
      it->second.second(entry.second);
    } catch (const YAML::Exception&) {
      return Error{where + ": '" + key + "' must be " + it->second.first};
    }
  }
  return {};
}

Expected<void> load_token(DaemonConfig& config) {
  if (config.token_file.empty()) return {};
  std::ifstream in(config.token_file);
  if (!in || !std::getline(in, config.server.token) || config.server.token.empty())
    return Error{"token file " + config.token_file + ": cannot read a token"};
  return {};
}

}  // namespace mcprun
