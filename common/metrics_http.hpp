// A Prometheus scrape endpoint over HTTP, on its owner's event loop: rendezvousd's metrics, and a
// launcher's under --metrics-port.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>

namespace mcprun {

/// A metrics connection must send its whole request within this, and read the answer within it.
inline constexpr std::chrono::seconds kMetricsReadTimeout{10};
/// Largest request header accepted: a scrape sends a few hundred bytes; a GET has no body.
inline constexpr size_t kMaxMetricsRequestBytes = 8 * 1024;
/// Metrics connections open at once; more are closed at once, so scrapers cannot crowd agents.
inline constexpr size_t kMaxMetricsConnections = 32;

/// Answers GET /metrics with what `render` returns, 404 for any other path, 405 for any other
/// method, and 4xx then a close for a malformed or oversized request.
class MetricsServer {
 public:
  MetricsServer(boost::asio::io_context& io, const boost::asio::ip::tcp::endpoint& listen,
                std::function<std::string()> render);
  ~MetricsServer();
  boost::asio::ip::tcp::endpoint local_endpoint() const { return acceptor_.local_endpoint(); }
  /// Stops accepting and closes every connection.
  void stop();

 private:
  class Connection;
  void accept();

  boost::asio::ip::tcp::acceptor acceptor_;
  std::function<std::string()> render_;
  std::set<std::shared_ptr<Connection>> connections_;
};

}  // namespace mcprun
