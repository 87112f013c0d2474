#include "launcher/commands/store_command.hpp"

#include <signal.h>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <cstdio>
#include <memory>

#include "common/connection_limits.hpp"
#include "common/descriptor_limit.hpp"
#include "common/exit_status.hpp"
#include "common/logging.hpp"
#include "launcher/config/subcommand.hpp"
#include "launcher/store/tcp_store.hpp"

namespace mcprun {
namespace {

constexpr const char* kStoreDescription =
    "mcprun store: a standalone c10d TCPStore server, for jobs that rendezvous through\n"
    "init_method=tcp://HOST:PORT or env:// (MASTER_ADDR/MASTER_PORT), and for benchmarks.\n\n"
    "It speaks torch's own TCPStore wire protocol, both the torch 1.x dialect and the 2.x one.\n"
    "Every rank has to be a client of it, so start the ranks with\n"
    "TORCHELASTIC_USE_AGENT_STORE=True and TORCHELASTIC_RESTART_COUNT=0 (torch then prefixes\n"
    "keys with /worker/attempt_0), or create torch.distributed.TCPStore(HOST, PORT,\n"
    "is_master=False) yourself.\n\n"
    "Once it accepts connections it prints one line, 'mcprun store: listening on ADDR:PORT', and\n"
    "it serves until SIGINT or SIGTERM. Exit status: 0 after such a signal, 1 when it cannot\n"
    "listen (e.g. the port is in use), 2 for bad flags.";

}  // namespace

int run_store_command(const std::vector<std::string>& args) {
  CLI::App app{kStoreDescription, "mcprun store"};
  app.option_defaults()->always_capture_default();
  std::string host = "0.0.0.0";
  int port = 29500;
  int ranks = 0;
  bool verbose = false;
  app.add_option("--host", host, "Address to listen on (an IP address or a host name)");
  app.add_option("--port", port, "Port to listen on; 0 picks a free one (the line says which)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--ranks", ranks,
                 "Ranks the store is for, one connection each: a warning when the open-file limit "
                 "or the listen backlog cannot hold them all at once (0: no check)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("-v,--verbose", verbose, "Log every connection and every store operation");
  if (auto done = parse_subcommand(app, args)) return *done;
  init_logging("mcprun", verbose);

  namespace asio = boost::asio;
  using tcp = asio::ip::tcp;
  asio::io_context io(1);  // One thread runs it: Asio can skip cross-thread wake-ups.
  boost::system::error_code ec;
  tcp::resolver resolver(io);
  auto found = resolver.resolve(host, std::to_string(port),
                                tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || found.empty())
    return usage_error("--host " + host + ": " + (ec ? ec.message() : "no address"));
  const tcp::endpoint endpoint = found.begin()->endpoint();
  const std::string address = endpoint.address().to_string();

  std::unique_ptr<TcpStoreServer> server;
  try {
    tcp::acceptor acceptor(io, endpoint.protocol());
    acceptor.set_option(asio::socket_base::reuse_address(true));  // As torch's own server does.
    acceptor.bind(endpoint);
    server = std::make_unique<TcpStoreServer>(io, std::move(acceptor));
  } catch (const boost::system::system_error& error) {
    spdlog::error("cannot listen on {}:{}: {}", address, port, error.code().message());
    return kExitFailure;
  }
  const long descriptors = raise_descriptor_limit();
  if (ranks > 0)
    if (auto warning = connection_limits_warning(fmt::format("the store for {} ranks", ranks),
                                                 static_cast<size_t>(ranks), kListenBacklog,
                                                 host_connection_limits(descriptors)))
      spdlog::warn("{}", *warning);
  // Armed before the line goes out: whoever reads it may signal right away.
  asio::signal_set stop_signals(io, SIGINT, SIGTERM);
  std::printf("mcprun store: listening on %s:%u\n", address.c_str(), server->port());
  std::fflush(stdout);
  stop_signals.async_wait([&](const boost::system::error_code& wait_ec, int signal_number) {
    if (wait_ec) return;
    spdlog::info("store: received signal {}; closing {} connection(s)", signal_number,
                 server->connection_count());
    server.reset();
    io.stop();
  });
  io.run();
  return kExitSuccess;
}

}  // namespace mcprun
