// rendezvousd: assigns ranks to mcprun agents and publishes MASTER_ADDR/MASTER_PORT.
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <CLI/CLI.hpp>

#include <csignal>
#include <fstream>
#include <iostream>

#include "common/exit_status.hpp"
#include "common/logging.hpp"
#include "rendezvousd/rendezvous_server.hpp"

int main(int argc, char** argv) {
  using namespace mcprun;
  CLI::App app{"rendezvousd: the rendezvous service for mcprun agents", "rendezvousd"};
  app.option_defaults()->always_capture_default();
  std::string listen = "0.0.0.0:29400", token_file;
  double lease_s = 15, first_message_s = 10;
  bool verbose = false;
  app.add_option("--listen", listen, "HOST:PORT to listen on (port 0: any; the port is logged)");
  app.add_option("--token-file", token_file, "File holding the shared token agents must present");
  app.add_option("--lease", lease_s, "Seconds of agent silence before it is declared lost")
      ->check(CLI::PositiveNumber);
  app.add_option("--first-message-timeout", first_message_s,
                 "Seconds a new connection may take to send its join")
      ->check(CLI::PositiveNumber);
  app.add_flag("-v,--verbose", verbose, "Log every join");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);
    std::fprintf(stderr, "rendezvousd: error: %s\n", error.what());
    return kExitUsage;
  }
  init_logging("rendezvousd", verbose);

  ServerSettings settings;
  settings.lease = std::chrono::milliseconds(static_cast<long>(lease_s * 1000));
  settings.first_message_timeout = std::chrono::milliseconds(static_cast<long>(first_message_s * 1000));
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in || !std::getline(in, settings.token) || settings.token.empty()) {
      std::fprintf(stderr, "rendezvousd: error: --token-file %s: cannot read a token\n",
                   token_file.c_str());
      return kExitUsage;
    }
  }
  auto colon = listen.rfind(':');
  boost::system::error_code ec;
  auto address = boost::asio::ip::make_address(listen.substr(0, colon), ec);
  int port = -1;
  try {
    if (colon != std::string::npos) port = std::stoi(listen.substr(colon + 1));
  } catch (const std::exception&) {
  }
  if (ec || port < 0 || port > 65535) {
    std::fprintf(stderr, "rendezvousd: error: --listen %s: expected IP:PORT\n", listen.c_str());
    return kExitUsage;
  }
  try {
    boost::asio::io_context io;
    RendezvousServer server(io, {address, static_cast<unsigned short>(port)}, settings);
    spdlog::info("listening on {}:{}", server.local_endpoint().address().to_string(),
                 server.local_endpoint().port());
    boost::asio::signal_set stop_signals(io, SIGINT, SIGTERM);
    stop_signals.async_wait([&](boost::system::error_code, int signal) {
      spdlog::info("received signal {}; stopping", signal);
      server.stop();
    });
    io.run();
  } catch (const boost::system::system_error& error) {
    spdlog::error("cannot listen on {}: {}", listen, error.code().message());
    return kExitFailure;
  }
  return kExitSuccess;
}
