// A free MASTER_PORT that stays ours until the job ends, without torchrun's bind-close-reuse race.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <optional>
#include <string>

#include "common/expected.hpp"
#include "common/unique_fd.hpp"

namespace mcprun {

/// Holds a TCP port bound (never listening) with SO_REUSEADDR on the wildcard address.
///
/// torchrun binds port 0, closes the socket and hands the number to rank 0, so anything may take
/// the port in between (pytorch/pytorch#91940). Here the socket stays bound for the whole job:
/// the kernel then neither hands the port to another bind(0) nor lets a plain bind take it, while
/// rank 0's TCPStore, which also sets SO_REUSEADDR, may still bind and listen on it, because
/// Linux only refuses a shared SO_REUSEADDR bind when a socket is already listening.
class PortReservation {
 public:
  /// Reserves `port` (0: any free one); an error message naming the failing call otherwise.
  static Expected<PortReservation> reserve(int port = 0);

  int port() const { return port_; }
  /// Hands the bound socket over (to the job store, which listens on it); the reservation is
  /// then empty.
  UniqueFd take_socket() { return std::move(fd_); }

 private:
  PortReservation(UniqueFd fd, int port) : fd_(std::move(fd)), port_(port) {}
  UniqueFd fd_;
  int port_ = 0;
};

/// The job store's listening socket on MASTER_PORT: the reserved socket when `reservation` holds
/// that port (the reservation is then spent), else a fresh bind (a --master-port the user chose).
/// An IPv6 MASTER_ADDR gets a dual-stack IPv6 socket, so that its workers can connect.
Expected<boost::asio::ip::tcp::acceptor> store_acceptor(
    boost::asio::io_context& io, const std::string& master_addr, int port,
    std::optional<PortReservation>& reservation);

}  // namespace mcprun
