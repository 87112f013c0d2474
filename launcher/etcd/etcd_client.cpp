#include "launcher/etcd/etcd_client.hpp"

#include <fmt/format.h>
#include <openssl/ssl.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <functional>

namespace mcprun::etcd {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using json = nlohmann::json;

std::string describe(const boost::system::error_code& error, std::chrono::milliseconds limit) {
  if (error == beast::error::timeout)
    return fmt::format("no answer within {:g} s", std::chrono::duration<double>(limit).count());
  return error.message();
}

/// An int64 as the gateway reads it best: a string.
std::string int64_text(int64_t value) { return std::to_string(value); }

json key_range(std::string_view prefix) {
  return {{"key", base64_encode(prefix)}, {"range_end", base64_encode(prefix_range_end(prefix))}};
}

/// A range request's fields for `options`, beside its key and range_end.
void add_range_options(json& request, const RangeOptions& options) {
  if (options.limit > 0) request["limit"] = int64_text(options.limit);
  if (options.keys_only) request["keys_only"] = true;
  switch (options.order) {
    case RangeOptions::Order::kKeyAscending:
      break;
    case RangeOptions::Order::kKeyDescending:
      request["sort_order"] = "DESCEND";
      request["sort_target"] = "KEY";
      break;
    case RangeOptions::Order::kCreatedFirst:
      request["sort_order"] = "ASCEND";
      request["sort_target"] = "CREATE";
      break;
  }
}

}  // namespace

/// One open connection to one member, with the loop that drives its bounded operations.
struct Client::Connection {
  asio::io_context io;
  std::optional<ssl::context> tls_context;
  std::optional<beast::tcp_stream> plain;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls;
  beast::flat_buffer buffer;
  std::string member;
  int requests = 0;

  beast::tcp_stream& lowest() { return tls ? beast::get_lowest_layer(*tls) : *plain; }
  /// Runs the operations started on the connection until they finish; their expiry bounds them.
  void run() {
    io.restart();
    io.run();
  }
  template <class Operation>
  void with_stream(Operation operation) {
    if (tls)
      operation(*tls);
    else
      operation(*plain);
  }
};

Client::Client(Settings settings) : settings_(std::move(settings)) {}
Client::~Client() = default;

std::string Client::member() const {
  return settings_.members.empty() ? std::string() : settings_.members[current_].text();
}

Expected<void> Client::connect() {
  connection_.reset();
  auto connection = std::make_unique<Connection>();
  const Endpoint& member = settings_.members[current_];
  connection->member = member.text();
  const auto limit = settings_.request_timeout;

  boost::system::error_code error;
  tcp::resolver::results_type addresses;
  tcp::resolver resolver(connection->io);
  asio::steady_timer resolve_deadline(connection->io, limit);
  resolver.async_resolve(member.host, std::to_string(member.port),
                         [&](const boost::system::error_code& e, tcp::resolver::results_type r) {
                           error = e;
                           addresses = std::move(r);
                           resolve_deadline.cancel();
                         });
  resolve_deadline.async_wait([&](const boost::system::error_code& e) {
    if (!e) resolver.cancel();
  });
  connection->run();
  if (error) return Error{"cannot resolve " + member.host + ": " + error.message()};

  if (settings_.tls) {
    try {
      auto& context = connection->tls_context.emplace(ssl::context::tls_client);
      if (settings_.ca_file.empty())
        context.set_default_verify_paths();
      else
        context.load_verify_file(settings_.ca_file);
      if (!settings_.cert_file.empty()) {
        context.use_certificate_chain_file(settings_.cert_file);
        context.use_private_key_file(settings_.key_file, ssl::context::pem);
      }
      context.set_verify_mode(ssl::verify_peer);
      connection->tls.emplace(connection->io, context);
      connection->tls->set_verify_callback(ssl::host_name_verification(member.host));
      SSL_set_tlsext_host_name(connection->tls->native_handle(), member.host.c_str());
    } catch (const boost::system::system_error& bad) {
      return Error{"TLS for etcd (cacert, cert, key): " + bad.code().message()};
    }
  } else {
    connection->plain.emplace(connection->io);
  }
  connection->lowest().expires_after(limit);
  connection->lowest().async_connect(
      addresses, [&](const boost::system::error_code& e, const tcp::endpoint&) { error = e; });
  connection->run();
  if (error) return Error{connection->member + ": " + describe(error, limit)};
  if (connection->tls) {
    connection->lowest().expires_after(limit);
    connection->tls->async_handshake(ssl::stream_base::client,
                                     [&](const boost::system::error_code& e) { error = e; });
    connection->run();
    if (error) return Error{connection->member + ": TLS handshake: " + describe(error, limit)};
  }
  boost::system::error_code ignored;
  local_address_ = connection->lowest().socket().local_endpoint(ignored).address().to_string();
  connection_ = std::move(connection);
  return {};
}

Expected<json> Client::call_member(std::string_view path, const std::string& body,
                                   bool& member_failed) {
  member_failed = true;
  // A kept connection the member closed meanwhile fails its next request: one fresh try.
  for (int attempt = 0;; ++attempt) {
    if (!connection_)
      if (auto connected = connect(); !connected) return connected.error();
    Connection& connection = *connection_;
    const bool reused = connection.requests++ > 0;
    http::request<http::string_body> request{http::verb::post, std::string(path), 11};
    request.set(http::field::host, connection.member);
    request.set(http::field::content_type, "application/json");
    request.keep_alive(true);
    request.body() = body;
    request.prepare_payload();
    http::response<http::string_body> response;
    boost::system::error_code error;
    connection.lowest().expires_after(settings_.request_timeout);
    connection.with_stream([&](auto& stream) {
      http::async_write(stream, request, [&](const boost::system::error_code& e, size_t) {
        if (e) {
          error = e;
          return;
        }
        http::async_read(stream, connection.buffer, response,
                         [&](const boost::system::error_code& e, size_t) { error = e; });
      });
    });
    connection.run();
    ++requests_;
    bytes_ += body.size() + response.body().size();
    const std::string member = connection.member;
    if (error || !response.keep_alive()) connection_.reset();
    if (error && reused && attempt == 0 && error != beast::error::timeout) continue;
    if (error) return Error{member + ": " + describe(error, settings_.request_timeout)};
    json answer = json::parse(response.body(), nullptr, /*allow_exceptions=*/false);
    if (response.result() == http::status::ok && answer.is_object()) return answer;
    const std::string said = answer.is_object() ? answer.value("message", answer.dump())
                                                : response.body().substr(0, 200);
    // Unavailable (no leader, or a member cut off from it) is the member's; the rest, etcd's.
    member_failed =
        response.result() == http::status::service_unavailable || answer.value("code", 0) == 14;
    return Error{fmt::format("{}: HTTP {}: {}", member, response.result_int(), said)};
  }
}

template <class Attempt>
auto Client::across_members(const std::string& what, Attempt attempt)
    -> decltype(attempt(std::declval<bool&>())) {
  if (settings_.members.empty()) return Error{"no etcd endpoint given"};
  std::string failures;
  for (size_t tried = 0; tried < settings_.members.size(); ++tried) {
    bool member_failed = true;
    auto answer = attempt(member_failed);
    if (answer || !member_failed) return answer;
    failures += (failures.empty() ? "" : "; ") + answer.error().message;
    connection_.reset();
    current_ = (current_ + 1) % settings_.members.size();
  }
  return Error{"no etcd member answered" + what + ": " + failures};
}

Expected<json> Client::call(std::string_view path, const json& body) {
  const std::string text = body.dump();
  return across_members(
      "", [&](bool& member_failed) { return call_member(path, text, member_failed); });
}

Expected<std::vector<KeyValue>> Client::range_prefix(std::string_view prefix, int64_t* revision,
                                                     RangeOptions options) {
  json request = key_range(prefix);
  add_range_options(request, options);
  auto answer = call("/v3/kv/range", request);
  if (!answer) return answer.error();
  if (revision) {
    auto read_at = int64_field(answer->value("header", json::object()), "revision");
    if (!read_at) return read_at.error();
    *revision = *read_at;
  }
  std::vector<KeyValue> keys;
  for (const auto& kv : answer->value("kvs", json::array())) {
    auto parsed = parse_key_value(kv);
    if (!parsed) return parsed.error();
    keys.push_back(std::move(*parsed));
  }
  return keys;
}

Expected<int64_t> Client::count_prefix(std::string_view prefix) {
  json request = key_range(prefix);
  request["count_only"] = true;
  auto answer = call("/v3/kv/range", request);
  if (!answer) return answer.error();
  return int64_field(*answer, "count");
}

Expected<std::optional<KeyValue>> Client::get(std::string_view key) {
  auto answer = call("/v3/kv/range", {{"key", base64_encode(key)}});
  if (!answer) return answer.error();
  const json kvs = answer->value("kvs", json::array());
  if (kvs.empty()) return std::optional<KeyValue>();
  auto parsed = parse_key_value(kvs[0]);
  if (!parsed) return parsed.error();
  return std::optional<KeyValue>(std::move(*parsed));
}

Expected<int64_t> Client::put(std::string_view key, std::string_view value, int64_t lease) {
  json body = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease) body["lease"] = int64_text(lease);
  auto answer = call("/v3/kv/put", body);
  if (!answer) return answer.error();
  return int64_field(answer->value("header", json::object()), "revision");
}

Expected<TxnResult> Client::transaction(std::string_view key, const json& compare,
                                        std::string_view value, int64_t lease) {
  json put = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease) put["lease"] = int64_text(lease);
  const json body = {
      {"compare", json::array({compare})},
      {"success", json::array({{{"request_put", put}}})},
      {"failure", json::array({{{"request_range", {{"key", base64_encode(key)}}}}})}};
  auto answer = call("/v3/kv/txn", body);
  if (!answer) return answer.error();
  TxnResult result;
  result.succeeded = answer->value("succeeded", false);  // Left out when false.
  auto revision = int64_field(answer->value("header", json::object()), "revision");
  if (!revision) return revision.error();
  result.revision = *revision;
  if (!result.succeeded)
    for (const auto& response : answer->value("responses", json::array()))
      for (const auto& kv :
           response.value("response_range", json::object()).value("kvs", json::array())) {
        auto parsed = parse_key_value(kv);
        if (!parsed) return parsed.error();
        result.current = std::move(*parsed);
      }
  return result;
}

Expected<TxnResult> Client::create(std::string_view key, std::string_view value, int64_t lease) {
  return transaction(key,
                     {{"key", base64_encode(key)},
                      {"target", "CREATE"},
                      {"result", "EQUAL"},
                      {"create_revision", "0"}},
                     value, lease);
}

Expected<TxnResult> Client::compare_and_swap(std::string_view key, int64_t mod_revision,
                                             std::string_view value, int64_t lease) {
  return transaction(key,
                     {{"key", base64_encode(key)},
                      {"target", "MOD"},
                      {"result", "EQUAL"},
                      {"mod_revision", int64_text(mod_revision)}},
                     value, lease);
}

Expected<int64_t> Client::erase(std::string_view key) {
  auto answer = call("/v3/kv/deleterange", {{"key", base64_encode(key)}});
  if (!answer) return answer.error();
  return int64_field(*answer, "deleted");
}

Expected<int64_t> Client::delete_prefix(std::string_view prefix) {
  auto answer = call("/v3/kv/deleterange", key_range(prefix));
  if (!answer) return answer.error();
  return int64_field(*answer, "deleted");
}

Expected<int64_t> Client::grant_lease(std::chrono::seconds ttl) {
  auto answer = call("/v3/lease/grant", {{"TTL", ttl.count()}});
  if (!answer) return answer.error();
  if (answer->contains("error") && !answer->value("error", std::string()).empty())
    return Error{"etcd granted no lease: " + answer->value("error", std::string())};
  return int64_field(*answer, "ID");
}

Expected<int64_t> Client::keep_alive(int64_t lease) {
  auto answer = call("/v3/lease/keepalive", {{"ID", int64_text(lease)}});
  if (!answer) return answer.error();
  return int64_field(answer->value("result", json::object()), "TTL");
}

Expected<void> Client::revoke(int64_t lease) {
  auto answer = call("/v3/lease/revoke", {{"ID", int64_text(lease)}});
  if (!answer) return answer.error();
  return {};
}

Expected<WatchResult> Client::watch_prefix(std::string_view prefix, int64_t from_revision,
                                           std::chrono::milliseconds limit) {
  return watch_range(prefix, prefix_range_end(prefix), from_revision, limit);
}

Expected<WatchResult> Client::watch_range(std::string_view key, std::string_view range_end,
                                          int64_t from_revision, std::chrono::milliseconds limit) {
  json create = {{"key", base64_encode(key)}};
  if (!range_end.empty()) create["range_end"] = base64_encode(range_end);  // Empty: `key` alone.
  create["start_revision"] = int64_text(from_revision);
  const std::string body = json{{"create_request", create}}.dump();
  return across_members(
      " the watch", [&](bool& member_failed) { return watch_member(body, limit, member_failed); });
}

Expected<WatchResult> Client::watch_member(const std::string& body, std::chrono::milliseconds limit,
                                           bool& member_failed) {
  member_failed = true;
  // A watch holds its connection for as long as it lasts: one of its own, closed after.
  auto kept = std::move(connection_);
  auto restore = [&] { connection_ = std::move(kept); };
  if (auto connected = connect(); !connected) {
    restore();
    return connected.error();
  }
  auto watch = std::move(connection_);
  restore();

  http::request<http::string_body> request{http::verb::post, "/v3/watch", 11};
  request.set(http::field::host, watch->member);
  request.set(http::field::content_type, "application/json");
  request.body() = body;
  request.prepare_payload();
  http::response_parser<http::string_body> parser;
  parser.body_limit(boost::none);
  boost::system::error_code error;
  bool created = false, done = false;
  size_t consumed = 0;
  WatchResult result;
  std::optional<std::string> failure;  ///< Why the watch failed, once it has.
  WatchStreamSplitter splitter;

  // Reads until the first events, a failure, or the deadline; a created watch that sees nothing
  // by then is an answer (no events), a member that never created it is not.
  std::function<void()> read_more;
  auto take_body = [&] {
    const std::string& received = parser.get().body();
    for (const std::string& line : splitter.feed(std::string_view(received).substr(consumed))) {
      auto response = parse_watch_response(line);
      if (!response) {
        failure = watch->member + ": " + response.error().message;
        return;
      }
      if (response->compact_revision) {
        // The history asked for is gone on every member: no other member answers better.
        member_failed = false;
        failure =
            fmt::format("the watch's revision was compacted (now {})", response->compact_revision);
        return;
      }
      if (response->canceled) {
        failure = watch->member + ": watch canceled: " + response->cancel_reason;
        return;
      }
      created = created || response->created;
      if (result.revision < response->revision) result.revision = response->revision;
      for (auto& event : response->events) {
        result.revision = std::max(result.revision, event.kv.mod_revision);
        result.events.push_back(std::move(event));
      }
      if (!result.events.empty()) done = true;
    }
    consumed = received.size();
  };
  // The watch's own deadline: the stream's per-operation expiry does not bound a body read
  // piecewise, so at `limit` the connection is closed and the read ends.
  asio::steady_timer deadline(watch->io, limit);
  bool expired = false;
  deadline.async_wait([&](const boost::system::error_code& e) {
    if (e) return;
    expired = true;
    watch->lowest().close();
  });
  read_more = [&] {
    watch->with_stream([&](auto& stream) {
      http::async_read_some(stream, watch->buffer, parser,
                            [&](const boost::system::error_code& e, size_t) {
                              take_body();
                              if (e) error = e;
                              if (!e && !done && !failure)
                                read_more();
                              else
                                deadline.cancel();
                            });
    });
  };
  watch->lowest().expires_after(limit);
  watch->with_stream([&](auto& stream) {
    http::async_write(stream, request, [&](const boost::system::error_code& e, size_t) {
      if (e) {
        error = e;
        deadline.cancel();
        return;
      }
      http::async_read_header(
          stream, watch->buffer, parser, [&](const boost::system::error_code& e, size_t) {
            if (!e && parser.get().result() == http::status::ok) return read_more();
            if (e)
              error = e;
            else
              failure = fmt::format("{}: HTTP {}", watch->member, parser.get().result_int());
            deadline.cancel();
          });
    });
  });
  watch->run();
  if (expired) error = beast::error::timeout;
  ++requests_;
  bytes_ += body.size() + parser.get().body().size();
  if (failure) return Error{*failure};
  if (done || (created && error == beast::error::timeout)) return result;
  return Error{watch->member + ": " + (error ? describe(error, limit) : "the watch ended")};
}

}  // namespace mcprun::etcd
