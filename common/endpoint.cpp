#include "common/endpoint.hpp"

#include <boost/asio/ip/address.hpp>
#include <charconv>

namespace mcprun {
namespace {

constexpr std::string_view kUnixPrefix = "unix:";

std::string quoted(std::string_view text) { return "'" + std::string(text) + "'"; }

/// "HOST:PORT or [IPV6]:PORT": the forms `rules` accept, for an error message.
std::string accepted_forms(const EndpointRules& rules) {
  const std::string port = rules.default_port ? "[:PORT]" : ":PORT";
  if (rules.allow_unix) return "HOST" + port + ", [IPV6]" + port + " or unix:PATH";
  return "HOST" + port + " or [IPV6]" + port;
}

Error malformed(std::string_view text, const EndpointRules& rules) {
  return Error{quoted(text) + ": expected " + accepted_forms(rules)};
}

std::optional<int> port_number(std::string_view text, bool allow_zero) {
  int port = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() ||
      port < (allow_zero ? 0 : 1) || port > 65535)
    return std::nullopt;
  return port;
}

Error bad_port(std::string_view text, bool allow_zero) {
  return Error{quoted(text) + ": the port must be a number from " + (allow_zero ? "0" : "1") +
               " to 65535"};
}

}  // namespace

std::string Endpoint::text() const {
  if (is_unix()) return std::string(kUnixPrefix) + unix_path;
  const bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Expected<int> parse_port(std::string_view text, bool allow_zero) {
  if (auto port = port_number(text, allow_zero)) return *port;
  return bad_port(text, allow_zero);
}

Expected<Endpoint> parse_endpoint(std::string_view text, EndpointRules rules) {
  Endpoint endpoint;
  if (text.starts_with(kUnixPrefix)) {
    if (!rules.allow_unix)
      return Error{quoted(text) + ": a unix socket is not accepted here; expected " +
                   accepted_forms(rules)};
    endpoint.unix_path = text.substr(kUnixPrefix.size());
    if (endpoint.unix_path.empty()) return Error{quoted(text) + ": unix: needs a socket path"};
    return endpoint;
  }
  std::string_view host = text;
  std::optional<std::string_view> port;  // nullopt: no ":PORT" was written.
  if (text.starts_with("[")) {  // The brackets keep an IPv6 address's colons out of the split.
    const auto close = text.find(']');
    if (close == std::string_view::npos) return malformed(text, rules);
    host = text.substr(1, close - 1);
    const std::string_view rest = text.substr(close + 1);
    if (rest.starts_with(":"))
      port = rest.substr(1);
    else if (!rest.empty())
      return malformed(text, rules);
  } else if (const auto colon = text.rfind(':'); colon != std::string_view::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty() || (!port && !rules.default_port)) return malformed(text, rules);
  endpoint.host = host;
  if (!port) {
    endpoint.port = *rules.default_port;
    return endpoint;
  }
  auto number = port_number(*port, rules.allow_port_zero);
  if (!number) return bad_port(text, rules.allow_port_zero);
  endpoint.port = *number;
  return endpoint;
}

Expected<boost::asio::ip::tcp::endpoint> parse_listen_address(const std::string& text) {
  auto endpoint = parse_endpoint(text, kListenRules);
  if (!endpoint) return endpoint.error();
  boost::system::error_code ec;
  const auto address = boost::asio::ip::make_address(endpoint->host, ec);
  if (ec) return Error{"'" + text + "': expected IP:PORT (an address, not a host name)"};
  return boost::asio::ip::tcp::endpoint(address, static_cast<unsigned short>(endpoint->port));
}

}  // namespace mcprun
