#include "launcher/plan/port_reservation.hpp"

#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace mcprun {

Expected<PortReservation> PortReservation::reserve(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Error{std::string("socket(AF_INET): ") + std::strerror(errno)};
  int one = 1;
  if (::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
    return Error{std::string("setsockopt(SO_REUSEADDR): ") + std::strerror(errno)};
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
    return Error{"bind(0.0.0.0:" + std::to_string(port) + "): " + std::strerror(errno)};
  socklen_t length = sizeof address;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0)
    return Error{std::string("getsockname: ") + std::strerror(errno)};
  return PortReservation(std::move(fd), ntohs(address.sin_port));
}

}  // namespace mcprun
