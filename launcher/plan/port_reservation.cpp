#include "launcher/plan/port_reservation.hpp"

#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <boost/asio/ip/v6_only.hpp>
#include <cerrno>
#include <cstring>

#include "common/connection_limits.hpp"

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

Expected<boost::asio::ip::tcp::acceptor> store_acceptor(
    boost::asio::io_context& io, const std::string& master_addr, int port,
    std::optional<PortReservation>& reservation) {
  namespace ip = boost::asio::ip;
  ip::tcp::acceptor acceptor(io);
  boost::system::error_code ec;
  const bool ipv6 = master_addr.find(':') != std::string::npos;
  if (reservation && reservation->port() == port && !ipv6) {
    acceptor.assign(ip::tcp::v4(), reservation->take_socket().release(), ec);
    reservation.reset();
  } else {
    const ip::tcp protocol = ipv6 ? ip::tcp::v6() : ip::tcp::v4();
    acceptor.open(protocol, ec);
    if (!ec) acceptor.set_option(ip::tcp::acceptor::reuse_address(true), ec);
    if (!ec && ipv6) acceptor.set_option(ip::v6_only(false), ec);
    if (!ec) acceptor.bind({protocol, static_cast<unsigned short>(port)}, ec);
  }
  if (!ec) acceptor.listen(kListenBacklog, ec);
  if (ec)
    return Error{
        fmt::format("cannot serve the job store on MASTER_PORT {}: {}", port, ec.message())};
  return acceptor;
}

}  // namespace mcprun
