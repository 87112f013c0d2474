// What the load generators share: their command line, their stdin command loop, and how a
// simulated peer's connection is opened. A generator is a class with
//   Generator(io_context&, tcp::endpoint server, size_t sources, milliseconds timeout)
//   void run(const std::string& command_line, std::function<void(const nlohmann::json&)> report)
//   void close_all()
// and main() is `return load_generator::main<Generator>(argc, argv, "name");`.
#pragma once

#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

namespace load_generator {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

/// Opens `socket` for peer `n` of many; against a loopback server, from one of `sources`
/// loopback addresses (127.0.0.1 up). From one address, each connect's search for a free local
/// port checks every connection already open to the server (the kernel's
/// __inet_check_established: 80 % of a generator's CPU at 16K, seconds), a cost of one host
/// holding every peer, never of a job, whose peers come from many hosts.
inline boost::system::error_code open_from(tcp::socket& socket, const tcp::endpoint& server,
                                           size_t sources, size_t n) {
  boost::system::error_code ec;
  socket.open(server.protocol(), ec);
  if (!ec && sources > 1 && server.address().is_loopback() && server.address().is_v4()) {
    int one = 1;  // The port is chosen at connect, per (source, server) pair.
    ::setsockopt(socket.native_handle(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    const uint32_t address = asio::ip::make_address_v4("127.0.0.1").to_uint() + n % sources;
    socket.bind(tcp::endpoint(asio::ip::address_v4(address), 0), ec);
  }
  return ec;
}

/// Reads commands from stdin, one at a time: the next is read once the last has answered.
template <class Generator>
class CommandLoop {
 public:
  CommandLoop(asio::io_context& io, Generator& generator)
      : input_(io, ::dup(STDIN_FILENO)), generator_(generator) {}

  void next() {
    asio::async_read_until(input_, buffer_, '\n', [this](boost::system::error_code ec, size_t) {
      if (ec) {  // The end of stdin: the bench is done with these peers.
        generator_.close_all();
        input_.close();
        return;
      }
      std::string line;
      std::istream in(&buffer_);
      std::getline(in, line);
      generator_.run(line, [this](const nlohmann::json& answer) {
        // Replaced, not thrown on: an answer may quote a server's bytes, any bytes at all.
        std::cout << answer.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                  << std::endl;
        next();
      });
    });
  }

 private:
  asio::posix::stream_descriptor input_;
  asio::streambuf buffer_;
  Generator& generator_;
};

/// A generator's main: --port PORT [--host 127.0.0.1] [--timeout SECONDS] [--sources 64], then
/// commands on stdin until its end.
template <class Generator>
int main(int argc, char** argv, const char* name) {
  std::string host = "127.0.0.1";
  int port = 0;
  double timeout = 60;
  size_t sources = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--host")
      host = argv[i + 1];
    else if (flag == "--port")
      port = std::stoi(argv[i + 1]);
    else if (flag == "--timeout")
      timeout = std::stod(argv[i + 1]);
    else if (flag == "--sources")
      sources = std::max(1ul, std::stoul(argv[i + 1]));
    else {
      std::cerr << name << ": unknown flag " << flag << "\n";
      return 2;
    }
  }
  if (port <= 0 || argc % 2 == 0) {
    std::cerr << "usage: " << name
              << " --port PORT [--host HOST] [--timeout SECONDS] [--sources N]\n";
    return 2;
  }
  // One descriptor per simulated peer: as many as the hard limit allows.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  asio::io_context io(1);
  Generator generator(io, tcp::endpoint(asio::ip::make_address(host), static_cast<uint16_t>(port)),
                      sources, std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000)));
  CommandLoop<Generator> commands(io, generator);
  commands.next();
  io.run();
  return 0;
}

}  // namespace load_generator
