#include "common/endpoint.hpp"

#include <gtest/gtest.h>

namespace mcprun {
namespace {

/// A bare HOST gets port 29400, as torchrun's c10d rendezvous gives it.
constexpr EndpointRules kDefaultPort{
    .allow_unix = false, .allow_port_zero = false, .default_port = 29400};

Endpoint parsed(std::string_view text, EndpointRules rules = {}) {
  auto endpoint = parse_endpoint(text, rules);
  EXPECT_TRUE(endpoint) << endpoint.error().message;
  return endpoint ? *endpoint : Endpoint{};
}

std::string error_of(std::string_view text, EndpointRules rules = {}) {
  auto endpoint = parse_endpoint(text, rules);
  EXPECT_FALSE(endpoint) << text;
  return endpoint ? "" : endpoint.error().message;
}

TEST(Endpoint, HostPortBracketedIpv6AndUnix) {
  EXPECT_EQ(parsed("head:29400"), (Endpoint{"head", 29400, ""}));
  EXPECT_EQ(parsed("10.0.0.1:1"), (Endpoint{"10.0.0.1", 1, ""}));
  EXPECT_EQ(parsed("[fd00::1]:29400"), (Endpoint{"fd00::1", 29400, ""}));
  // Unbracketed, an address splits at its last colon: what rendezvousd --listen ::1:PORT meant.
  EXPECT_EQ(parsed("::1:29400"), (Endpoint{"::1", 29400, ""}));
  EXPECT_EQ(parsed("unix:/run/r.sock", kConnectRules), (Endpoint{"", 0, "/run/r.sock"}));
}

TEST(Endpoint, TextIsWhatAUserWrites) {
  for (const char* text : {"head:29400", "[fd00::1]:29400", "unix:/run/r.sock"})
    EXPECT_EQ(parsed(text, kConnectRules).text(), text);
  EXPECT_EQ((Endpoint{"::1", 80, ""}).text(), "[::1]:80");
}

TEST(Endpoint, EveryErrorQuotesTheInputAndSaysWhatWasExpected) {
  EXPECT_EQ(error_of("head"), "'head': expected HOST:PORT or [IPV6]:PORT");
  EXPECT_EQ(error_of("head", kConnectRules),
            "'head': expected HOST:PORT, [IPV6]:PORT or unix:PATH");
  EXPECT_EQ(error_of("head:x"), "'head:x': the port must be a number from 1 to 65535");
  EXPECT_EQ(error_of("head:0"), "'head:0': the port must be a number from 1 to 65535");
  EXPECT_EQ(error_of("unix:", kConnectRules), "'unix:': unix: needs a socket path");
  EXPECT_EQ(error_of("unix:/run/r.sock"),
            "'unix:/run/r.sock': a unix socket is not accepted here; expected HOST:PORT or "
            "[IPV6]:PORT");
  for (const char* bad : {":29400", "head:", "head:99999", "head:-1", "head:+1", "[fd00::1]",
                          "[fd00::1]x", "[fd00::1", "[]:80", ""})
    EXPECT_EQ(error_of(bad).rfind("'" + std::string(bad) + "': ", 0), 0u) << bad;
}

TEST(Endpoint, PortZeroAndADefaultPortWhereTheCallerAllowsThem) {
  EXPECT_EQ(parsed("0.0.0.0:0", kListenRules).port, 0);
  EXPECT_EQ(error_of("0.0.0.0:-1", kListenRules),
            "'0.0.0.0:-1': the port must be a number from 0 to 65535");
  EXPECT_EQ(parsed("head", kDefaultPort), (Endpoint{"head", 29400, ""}));
  EXPECT_EQ(parsed("[fd00::1]", kDefaultPort), (Endpoint{"fd00::1", 29400, ""}));
  EXPECT_EQ(parsed("head:7", kDefaultPort).port, 7);
  EXPECT_EQ(error_of("head:", kDefaultPort), "'head:': the port must be a number from 1 to 65535");
}

TEST(Endpoint, PortAlone) {
  EXPECT_EQ(*parse_port("65535"), 65535);
  EXPECT_EQ(*parse_port("0", /*allow_zero=*/true), 0);
  EXPECT_EQ(parse_port("0").error().message, "'0': the port must be a number from 1 to 65535");
  for (const char* bad : {"", "65536", "x", "1 ", "-5"}) EXPECT_FALSE(parse_port(bad)) << bad;
}

}  // namespace
}  // namespace mcprun
