#include "common/metrics_http.hpp"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <optional>

#include "common/logging.hpp"

namespace mcprun {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

/// One scraper's connection: requests read under a deadline and a size cap, answered in order.
class MetricsServer::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, MetricsServer& server)
      : stream_(std::move(socket)), buffer_(kMaxMetricsRequestBytes), server_(server) {}

  void start() { read(); }

  /// Once closed, a connection never touches the server again: stop() may be its last call.
  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    server_.connections_.erase(shared_from_this());
  }

 private:
  void read() {
    parser_.emplace();
    parser_->header_limit(kMaxMetricsRequestBytes);
    parser_->body_limit(0);
    stream_.expires_after(kMetricsReadTimeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (closed_) return;
    // The peer left, went silent past the deadline, or the server is stopping: nothing to answer.
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset)
      return close();
    if (ec) {
      spdlog::debug("metrics: bad request: {}", ec.message());
      const auto status = ec == http::error::header_limit || ec == http::error::buffer_overflow
                              ? http::status::request_header_fields_too_large
                              : http::status::bad_request;
      return reply(status, ec.message() + "\n", false);
    }
    const auto& request = parser_->get();
    const auto target = request.target();
    if (request.method() != http::verb::get)
      return reply(http::status::method_not_allowed, "only GET is served\n", request.keep_alive());
    if (target.substr(0, target.find('?')) != "/metrics")
      return reply(http::status::not_found, "not found; the metrics are at /metrics\n",
                   request.keep_alive());
    reply(http::status::ok, server_.render_(), request.keep_alive());
  }

  void reply(http::status status, std::string body, bool keep_alive) {
    response_ = {};
    response_.result(status);
    response_.version(11);
    response_.set(http::field::server, "rendezvousd");
    response_.set(http::field::content_type, status == http::status::ok
                                                 ? "text/plain; version=0.0.4; charset=utf-8"
                                                 : "text/plain; charset=utf-8");
    response_.keep_alive(keep_alive);
    response_.body() = std::move(body);
    response_.prepare_payload();
    stream_.expires_after(kMetricsReadTimeout);  // A scraper that stops reading is cut off too.
    http::async_write(stream_, response_,
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (self->closed_) return;
                        if (ec || !self->response_.keep_alive()) return self->close();
                        self->read();
                      });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::empty_body>> parser_;
  http::response<http::string_body> response_;
  MetricsServer& server_;
  bool closed_ = false;
};

MetricsServer::MetricsServer(asio::io_context& io, const tcp::endpoint& listen,
                             std::function<std::string()> render)
    : acceptor_(io, listen, /*reuse_address=*/true), render_(std::move(render)) {
  accept();
}

MetricsServer::~MetricsServer() { stop(); }

void MetricsServer::stop() {
  beast::error_code ignored;
  acceptor_.close(ignored);
  auto connections = connections_;
  for (const auto& connection : connections) connection->close();
}

void MetricsServer::accept() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec && connections_.size() >= kMaxMetricsConnections) {
      spdlog::warn("metrics: {} connections open; refusing another", connections_.size());
    } else if (!ec) {
      auto connection = std::make_shared<Connection>(std::move(socket), *this);
      connections_.insert(connection);
      connection->start();
    }
    accept();
  });
}

}  // namespace mcprun
