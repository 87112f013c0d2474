// rendezvousd: assigns ranks to mcprun agents and publishes MASTER_ADDR/MASTER_PORT.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "common/connection_limits.hpp"
#include "common/descriptor_limit.hpp"
#include "common/exit_status.hpp"
#include "common/expected.hpp"
#include "common/logging.hpp"
#include "common/metrics_http.hpp"
#include "common/prometheus_text.hpp"
#include "common/version.hpp"
#include "rendezvous/rendezvous_server.hpp"
#include "rendezvousd/daemon_config.hpp"
#include "rendezvousd/daemon_metrics.hpp"
#include "rendezvousd/systemd_notify.hpp"

namespace {

using namespace mcprun;
using tcp = boost::asio::ip::tcp;

/// The command line, kept so that a reload lays it over the re-read file as the start did.
struct DaemonFlags {
  std::string config_file, listen, metrics_listen, unix_socket, token_file;
  double lease_s = 0, first_message_s = 0, stop_timeout_s = 0;
  bool verbose = false;
};

/// A configuration ready to serve, with its addresses parsed.
struct StartupConfig {
  DaemonConfig config;
  tcp::endpoint listen;
  std::optional<tcp::endpoint> metrics;
};

std::chrono::milliseconds seconds_to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<long>(seconds * 1000));
}

/// The file, the flags over it, the token: the one way a configuration is built, at start and on
/// SIGHUP. An error line naming the input otherwise.
Expected<StartupConfig> build_config(const DaemonFlags& flags) {
  StartupConfig built;
  DaemonConfig& config = built.config;
  if (!flags.config_file.empty())
    if (auto loaded = load_daemon_config(flags.config_file, config); !loaded) return loaded.error();
  if (!flags.listen.empty()) config.listen = flags.listen;
  if (!flags.metrics_listen.empty()) config.metrics_listen = flags.metrics_listen;
  if (!flags.token_file.empty()) config.token_file = flags.token_file;
  if (!flags.unix_socket.empty()) config.server.unix_socket = flags.unix_socket;
  if (flags.lease_s > 0) config.server.lease = seconds_to_ms(flags.lease_s);
  if (flags.first_message_s > 0)
    config.server.first_message_timeout = seconds_to_ms(flags.first_message_s);
  if (flags.stop_timeout_s > 0) config.stop_timeout = seconds_to_ms(flags.stop_timeout_s);
  if (flags.verbose) config.log_level = spdlog::level::debug;
  if (auto loaded = load_token(config); !loaded) return loaded.error();
  auto listen = parse_listen_address(config.listen);
  if (!listen) return Error{"listen " + listen.error().message};
  built.listen = *listen;
  if (!config.metrics_listen.empty()) {
    auto metrics = parse_listen_address(config.metrics_listen);
    if (!metrics) return Error{"metrics_listen " + metrics.error().message};
    built.metrics = *metrics;
  }
  return built;
}

/// The systemd status line: what the daemon holds.
std::string status_line(const ServerLoad& load) {
  return fmt::format("jobs: {} joining, {} running, {} finished; nodes: {}; connections: {}",
                     load.joining, load.running, load.finished, load.nodes, load.connections);
}

/// A quiet loop waits this long after each round of handlers, so that idle agents' heartbeats
/// wake the daemon in batches: woken for each, 16,384 paced agents cost it 1.0 % of a core; in
/// rounds, 0.7 %. A reply is at most that much later, which nothing the daemon answers notices.
constexpr std::chrono::milliseconds kQuietRoundGap{20};
/// Handlers in one round from which the loop is busy (a round forming) and goes straight on.
constexpr size_t kBusyRound = 64;

/// Runs the loop; an exception a handler let out is logged and the loop goes on: a fault that
/// one connection causes must never end the daemon, and with it every job it serves.
void run_contained(boost::asio::io_context& io) {
  for (;;) {
    try {
      while (io.run_one() > 0)
        if (1 + io.poll() < kBusyRound) std::this_thread::sleep_for(kQuietRoundGap);
      return;
    } catch (const std::exception& error) {
      spdlog::error("a handler failed: {}; serving on", error.what());
    }
  }
}

/// Applies a reloaded configuration where it can change at run time; returns the running one.
DaemonConfig apply_reload(const DaemonConfig& running, DaemonConfig next,
                          RendezvousServer& server) {
  const std::pair<const char*, std::pair<std::string, std::string>> fixed[] = {
      {"listen", {running.listen, next.listen}},
      {"unix_socket", {running.server.unix_socket, next.server.unix_socket}},
      {"metrics_listen", {running.metrics_listen, next.metrics_listen}}};
  for (const auto& [key, values] : fixed)
    if (values.first != values.second)
      spdlog::warn("reload: {} changed from '{}' to '{}'; that needs a restart", key, values.first,
                   values.second);
  if (next.server.listen_backlog != running.server.listen_backlog)
    spdlog::warn("reload: listen_backlog changed from {} to {}; that needs a restart",
                 running.server.listen_backlog, next.server.listen_backlog);
  next.server.listen_backlog = running.server.listen_backlog;
  next.listen = running.listen;
  next.server.unix_socket = running.server.unix_socket;
  next.metrics_listen = running.metrics_listen;
  server.reload(next.server);
  spdlog::set_level(next.log_level);
  return next;
}

/// The flags, each over the file's value; defaults as --help shows them.
void add_flags(CLI::App& app, DaemonFlags& flags) {
  const DaemonConfig defaults;
  const auto seconds_of = [](std::chrono::milliseconds ms) {
    return fmt::format("{:g}", std::chrono::duration<double>(ms).count());
  };
  app.add_option("--config", flags.config_file,
                 "YAML configuration (see configs/rendezvousd.yaml); SIGHUP re-reads it");
  app.add_option("--listen", flags.listen,
                 "IP:PORT to listen on (default 0.0.0.0:29400; port 0: any, logged)");
  app.add_option("--unix-socket", flags.unix_socket,
                 "Also listen on this unix socket for local agents "
                 "(mcprun --rdzv-endpoint unix:PATH)");
  app.add_option(
      "--metrics-listen", flags.metrics_listen,
      "IP:PORT serving Prometheus metrics at /metrics (default: none; port 0: any, logged)");
  app.add_option("--token-file", flags.token_file,
                 "File holding the shared token agents must present");
  app.add_option("--lease", flags.lease_s,
                 fmt::format("Seconds of agent silence before it is lost (default {})",
                             seconds_of(defaults.server.lease)))
      ->check(CLI::PositiveNumber);
  app.add_option("--first-message-timeout", flags.first_message_s,
                 fmt::format("Seconds a new connection may take to send its join (default {})",
                             seconds_of(defaults.server.first_message_timeout)))
      ->check(CLI::PositiveNumber);
  app.add_option("--stop-timeout", flags.stop_timeout_s,
                 fmt::format("Seconds SIGTERM may take before the exit is forced (default {})",
                             kDefaultStopTimeout.count()))
      ->check(CLI::PositiveNumber);
  app.add_flag("-v,--verbose", flags.verbose, "Debug logging");
  app.set_version_flag("--version", "rendezvousd " + mcprun_version());
}

/// Opens the rendezvous server and the metrics endpoint; false, with the error logged, when an
/// address cannot be had.
bool open_listeners(boost::asio::io_context& io, const StartupConfig& startup,
                    std::optional<RendezvousServer>& server,
                    std::optional<MetricsServer>& metrics) {
  const DaemonConfig& config = startup.config;
  std::string listening = config.listen;  // What was being opened, for the error line.
  if (!config.server.unix_socket.empty()) listening += " and unix:" + config.server.unix_socket;
  try {
    server.emplace(io, startup.listen, config.server);
    spdlog::info("listening on {}:{}", server->local_endpoint().address().to_string(),
                 server->local_endpoint().port());
    if (!config.server.unix_socket.empty())
      spdlog::info("listening on unix:{}", config.server.unix_socket);
    if (startup.metrics) {
      listening = config.metrics_listen;
      metrics.emplace(io, *startup.metrics, [&server] {
        return render_metrics(server->stats(), server->load(), resident_memory_bytes());
      });
      spdlog::info("serving metrics on http://{}:{}/metrics",
                   metrics->local_endpoint().address().to_string(),
                   metrics->local_endpoint().port());
    }
  } catch (const boost::system::system_error& error) {
    spdlog::error("cannot listen on {}: {}", listening, error.what());
    return false;
  }
  return true;
}

/// What a SIGHUP touches: the flags to lay over the re-read file, and the running configuration.
struct Reloadable {
  boost::asio::signal_set& signal;
  ServiceNotifier& notifier;
  const DaemonFlags& flags;
  DaemonConfig& config;
  RendezvousServer& server;
};

/// On each SIGHUP: rebuild the configuration as the start did and apply what may change.
void reload_on_sighup(Reloadable& reload) {
  reload.signal.async_wait([&reload](boost::system::error_code ec, int) {
    if (ec) return;
    reload.notifier.reloading();
    auto reloaded = build_config(reload.flags);
    if (reloaded) {
      reload.config = apply_reload(reload.config, std::move(reloaded->config), reload.server);
      spdlog::info("reloaded the configuration{}",
                   reload.flags.config_file.empty() ? "" : " from " + reload.flags.config_file);
    } else {
      spdlog::error("reload refused, keeping the running configuration: {}",
                    reloaded.error().message);
    }
    reload.notifier.ready();
    reload_on_sighup(reload);
  });
}

/// After a stop: what is left (answers being written) drains, bounded by the stop timeout.
int drain_after_stop(boost::asio::io_context& io, std::chrono::milliseconds stop_timeout) {
  io.restart();
  try {
    io.run_for(stop_timeout);
  } catch (const std::exception& error) {
    spdlog::error("a handler failed while stopping: {}", error.what());
  }
  if (!io.stopped()) {
    spdlog::error("still closing connections after {} s; forcing the exit",
                  std::chrono::duration<double>(stop_timeout).count());
    return kExitFailure;
  }
  return kExitSuccess;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"rendezvousd: the rendezvous service for mcprun agents", "rendezvousd"};
  app.option_defaults()->always_capture_default();
  DaemonFlags flags;
  add_flags(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);
    std::fprintf(stderr, "rendezvousd: error: %s\n", error.what());
    return kExitUsage;
  }
  init_logging("rendezvousd", flags.verbose);
  auto built = build_config(flags);
  if (!built) {
    std::fprintf(stderr, "rendezvousd: error: %s\n", built.error().message.c_str());
    return kExitUsage;
  }
  StartupConfig& startup = *built;
  DaemonConfig& config = startup.config;
  spdlog::set_level(config.log_level);
  const long descriptors = raise_descriptor_limit();
  if (auto warning = connection_limits_warning(
          fmt::format("rendezvousd's max_connections {}", config.server.max_connections),
          config.server.max_connections, config.server.listen_backlog,
          host_connection_limits(descriptors)))
    spdlog::warn("{}", *warning);

  boost::asio::io_context io;
  // Caught from here on, though handled only once the loop runs: none may kill the daemon early.
  boost::asio::signal_set stop_signals(io, SIGINT, SIGTERM), reload_signal(io, SIGHUP);
  std::optional<RendezvousServer> server;
  std::optional<MetricsServer> metrics;
  if (!open_listeners(io, startup, server, metrics)) return kExitFailure;

  ServiceNotifier notifier(
      io, NotifySocket::from_environment(),
      watchdog_interval(std::getenv("WATCHDOG_USEC"), std::getenv("WATCHDOG_PID"), ::getpid()),
      [&] { return status_line(server->load()); });
  Reloadable reload{reload_signal, notifier, flags, config, *server};
  reload_on_sighup(reload);
  bool stopping = false;
  stop_signals.async_wait([&](boost::system::error_code ec, int signal) {
    if (ec) return;
    spdlog::info("received signal {}; stopping", signal);
    stopping = true;
    notifier.stopping();
    reload_signal.cancel();
    server->stop();
    if (metrics) metrics->stop();
    io.stop();  // What is left drains below, under the stop timeout.
  });
  notifier.ready();
  run_contained(io);
  if (!stopping) return kExitSuccess;
  return drain_after_stop(io, config.stop_timeout);
}
