// A free MASTER_PORT that stays ours until the job ends, without torchrun's bind-close-reuse race.
#pragma once

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

}  // namespace mcprun
