// Where a peer listens, as a user writes it: HOST:PORT, [IPV6]:PORT or unix:PATH. The one parser
// behind every flag, file key and variable that names an endpoint.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/expected.hpp"

namespace mcprun {

/// A TCP host and port, or a unix socket.
struct Endpoint {
  std::string host;  ///< Without brackets ("fd00::1"); empty for a unix socket.
  int port = 0;
  std::string unix_path;  ///< Set for "unix:PATH".

  bool is_unix() const { return !unix_path.empty(); }
  /// As a user writes it: "head:29400", "[fd00::1]:29400", "unix:/run/r.sock".
  std::string text() const;
  bool operator==(const Endpoint&) const = default;
};

/// What a caller accepts beyond HOST:PORT and [IPV6]:PORT.
struct EndpointRules {
  bool allow_unix = false;          ///< "unix:PATH".
  bool allow_port_zero = false;     ///< Port 0, which means "any free port" to a listener.
  std::optional<int> default_port;  ///< A bare HOST or [IPV6] gets this port; nullopt: required.
};

/// A peer to connect to: over TCP, or on this host over a unix socket (a rendezvousd).
inline constexpr EndpointRules kConnectRules{
    .allow_unix = true, .allow_port_zero = false, .default_port = std::nullopt};
/// A c10d rendezvous endpoint: torch's c10d backend gives a bare HOST port 29400.
inline constexpr EndpointRules kC10dRules{
    .allow_unix = true, .allow_port_zero = false, .default_port = 29400};
/// An address to listen on, where port 0 asks the kernel for any free port.
inline constexpr EndpointRules kListenRules{
    .allow_unix = false, .allow_port_zero = true, .default_port = std::nullopt};

/// Parses `text` by `rules`; the error quotes it: "'head': expected HOST:PORT or [IPV6]:PORT".
/// An unbracketed address splits at its last colon, so "::1:29400" is ::1, port 29400.
Expected<Endpoint> parse_endpoint(std::string_view text, EndpointRules rules = {});

/// A port number from 1 to 65535 (from 0 with `allow_zero`); the error quotes `text`.
Expected<int> parse_port(std::string_view text, bool allow_zero = false);

/// "IP:PORT" or "[IPV6]:PORT" (port 0: any) to listen on; an error quoting `text` when it is
/// not one (a host name is not: a listener binds an address).
Expected<boost::asio::ip::tcp::endpoint> parse_listen_address(const std::string& text);

}  // namespace mcprun
