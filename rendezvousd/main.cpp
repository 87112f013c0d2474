// rendezvousd: assigns ranks to mcprun agents and publishes MASTER_ADDR/MASTER_PORT.
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <CLI/CLI.hpp>

#include <csignal>
#include <sys/resource.h>

#include <fstream>
#include <iostream>

#include "common/exit_status.hpp"
#include "common/logging.hpp"
#include "rendezvousd/daemon_config.hpp"
#include "rendezvousd/rendezvous_server.hpp"

namespace {

/// A daemon with thousands of agents needs more descriptors than the usual soft limit of 1024.
void raise_descriptor_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mcprun;
  CLI::App app{"rendezvousd: the rendezvous service for mcprun agents", "rendezvousd"};
  app.option_defaults()->always_capture_default();
  DaemonConfig config;
  std::string config_file, listen, token_file;
  double lease_s = 0, first_message_s = 0;
  bool verbose = false;
  app.add_option("--config", config_file, "YAML configuration (see configs/rendezvousd.yaml)");
  app.add_option("--listen", listen, "IP:PORT to listen on (default 0.0.0.0:29400; port 0: any, logged)");
  std::string unix_socket;
  app.add_option("--unix-socket", unix_socket, "Also listen on this unix socket for local agents "
                 "(mcprun --rdzv-endpoint unix:PATH)");
  app.add_option("--token-file", token_file, "File holding the shared token agents must present");
  app.add_option("--lease", lease_s, "Seconds of agent silence before it is lost (default 15)")
      ->check(CLI::PositiveNumber);
  app.add_option("--first-message-timeout", first_message_s,
                 "Seconds a new connection may take to send its join (default 10)")
      ->check(CLI::PositiveNumber);
  app.add_flag("-v,--verbose", verbose, "Debug logging");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);
    std::fprintf(stderr, "rendezvousd: error: %s\n", error.what());
    return kExitUsage;
  }
  init_logging("rendezvousd", verbose);
  if (!config_file.empty())
    if (auto error = load_daemon_config(config_file, config)) {
      std::fprintf(stderr, "rendezvousd: error: %s\n", error->c_str());
      return kExitUsage;
    }
  // Flags override the file.
  if (!listen.empty()) config.listen = listen;
  if (!token_file.empty()) config.token_file = token_file;
  if (!unix_socket.empty()) config.server.unix_socket = unix_socket;
  if (lease_s > 0) config.server.lease = std::chrono::milliseconds(static_cast<long>(lease_s * 1000));
  if (first_message_s > 0)
    config.server.first_message_timeout = std::chrono::milliseconds(static_cast<long>(first_message_s * 1000));
  if (auto error = load_token(config)) {
    std::fprintf(stderr, "rendezvousd: error: %s\n", error->c_str());
    return kExitUsage;
  }
  raise_descriptor_limit();

  auto colon = config.listen.rfind(':');
  boost::system::error_code ec;
  auto address = boost::asio::ip::make_address(config.listen.substr(0, colon), ec);
  int port = -1;
  try {
    if (colon != std::string::npos) port = std::stoi(config.listen.substr(colon + 1));
  } catch (const std::exception&) {
  }
  if (ec || port < 0 || port > 65535) {
    std::fprintf(stderr, "rendezvousd: error: listen %s: expected IP:PORT\n", config.listen.c_str());
    return kExitUsage;
  }
  try {
    boost::asio::io_context io;
    RendezvousServer server(io, {address, static_cast<unsigned short>(port)}, config.server);
    spdlog::info("listening on {}:{}", server.local_endpoint().address().to_string(),
                 server.local_endpoint().port());
    if (!config.server.unix_socket.empty())
      spdlog::info("listening on unix:{}", config.server.unix_socket);
    boost::asio::signal_set stop_signals(io, SIGINT, SIGTERM);
    stop_signals.async_wait([&](boost::system::error_code, int signal) {
      spdlog::info("received signal {}; stopping", signal);
      server.stop();
    });
    io.run();
  } catch (const boost::system::system_error& error) {
    spdlog::error("cannot listen on {}: {}", config.listen, error.code().message());
    return kExitFailure;
  }
  return kExitSuccess;
}
