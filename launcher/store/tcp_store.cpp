#include "launcher/store/tcp_store.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "common/connection_limits.hpp"
#include "common/logging.hpp"

namespace mcprun {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

/// A connection's read buffer to begin with; it grows for a request larger than this. A rank's
/// requests are small (keys, addresses, progress records), and every rank holds a connection:
/// 64 KiB cost 1 GiB at 16,384 ranks.
constexpr size_t kReadBufferBytes = 4 * 1024;
/// A reply buffer larger than this is given back once written.
constexpr size_t kKeptReplyBytes = 1024 * 1024;
/// Replies a peer has not read yet; past this the session stops reading its requests.
constexpr size_t kMaxQueuedReplyBytes = 64 * 1024 * 1024;
/// Pause before accepting again after accept failed (e.g. out of descriptors).
constexpr std::chrono::milliseconds kAcceptRetryDelay{100};

}  // namespace

class StoreSession;

class TcpStoreService : public StoreOutlet, public std::enable_shared_from_this<TcpStoreService> {
 public:
  TcpStoreService(asio::io_context& io, tcp::acceptor acceptor, TcpStoreServer::Listener listener)
      : acceptor_(std::move(acceptor)), accept_retry_(io), listener_(std::move(listener)) {
    int listening = 0;
    socklen_t size = sizeof listening;
    ::getsockopt(acceptor_.native_handle(), SOL_SOCKET, SO_ACCEPTCONN, &listening, &size);
    if (!listening) acceptor_.listen(kListenBacklog);
    port_ = acceptor_.local_endpoint().port();
  }

  void start() { accept(); }
  /// Stops accepting and closes every session, without telling the listener any more.
  void stop();
  /// Closes every session and empties the state; accepting goes on.
  void reset();

  unsigned short port() const { return port_; }
  size_t connection_count() const { return sessions_.size(); }
  StoreState& state() { return state_; }

  void deliver(uint64_t connection, std::string_view bytes) override;
  void changed(StoreEvent::Kind kind, uint64_t connection, std::string_view key,
               int64_t value) override;
  /// A session closed: forget its waits and watches.
  void closed(const StoreSession& session);

 private:
  void accept();
  void admit(tcp::socket socket);
  void publish(const StoreEvent& event) {
    if (listener_) listener_(event);
  }

  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;
  TcpStoreServer::Listener listener_;
  StoreState state_{*this};
  std::unordered_map<uint64_t, std::shared_ptr<StoreSession>> sessions_;
  uint64_t next_connection_ = 1;
  unsigned short port_ = 0;
  bool stopped_ = false;
};

/// One client connection: reads into a large buffer, runs every complete request in it, and
/// writes the replies of that whole batch at once.
class StoreSession : public std::enable_shared_from_this<StoreSession> {
 public:
  StoreSession(tcp::socket socket, std::shared_ptr<TcpStoreService> service, uint64_t id,
               tcp::endpoint peer)
      : socket_(std::move(socket)),
        service_(std::move(service)),
        id_(id),
        peer_(std::move(peer)),
        protocol_(service_->state(), id),
        inbox_(kReadBufferBytes) {}

  void start() { read(); }
  uint64_t id() const { return id_; }
  const tcp::endpoint& peer() const { return peer_; }

  /// Queues bytes that are not a reply to this session's own batch (wake-ups, watch notices).
  void push(std::string_view bytes) {
    if (closed_) return;
    outbox_.append(bytes);
    if (!batching_) flush();
  }

  void close() {
    if (closed_) return;
    auto self = shared_from_this();  // The service drops its reference below.
    shut();
    service_->closed(*this);
  }
  /// Closes the socket without telling the service, which is stopping.
  void shut() {
    closed_ = true;
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

 private:
  void read() {
    if (reading_ || closed_ || outbox_.size() + sending_.size() > kMaxQueuedReplyBytes) return;
    reading_ = true;
    socket_.async_read_some(asio::buffer(inbox_.data() + filled_, inbox_.size() - filled_),
                            [self = shared_from_this()](const boost::system::error_code& ec,
                                                        size_t n) { self->on_read(ec, n); });
  }

  void on_read(const boost::system::error_code& ec, size_t n) {
    reading_ = false;
    if (closed_) return;
    if (ec) return fail(ec, "read");
    filled_ += n;
    batching_ = true;
    const size_t used = protocol_.consume(std::string_view(inbox_.data(), filled_), outbox_);
    batching_ = false;
    if (protocol_.failed()) {
      spdlog::warn("store: connection {} from {}: {}; closing it", id_, peer_name(),
                   protocol_.error());
      return close();
    }
    if (used > 0) {  // Only then: a large request arriving piecemeal must not be copied each time.
      std::memmove(inbox_.data(), inbox_.data() + used, filled_ - used);
      filled_ -= used;
    }
    if (filled_ == inbox_.size()) {
      inbox_.resize(inbox_.size() * 2);  // One request outgrew the buffer; the protocol caps it.
    } else if (filled_ == 0 && inbox_.size() > kReadBufferBytes) {
      inbox_ = std::vector<char>(kReadBufferBytes);
    }
    flush();
    read();
  }

  void flush() {
    if (writing_ || closed_ || outbox_.empty()) return;
    outbox_.swap(sending_);
    writing_ = true;
    asio::async_write(socket_, asio::buffer(sending_),
                      [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                        self->on_write(ec);
                      });
  }

  void on_write(const boost::system::error_code& ec) {
    writing_ = false;
    if (closed_) return;
    if (ec) return fail(ec, "write");
    if (sending_.capacity() > kKeptReplyBytes) {
      std::string().swap(sending_);  // Give back what a large reply took.
    } else {
      sending_.clear();
    }
    flush();
    read();  // In case a backlog of unread replies had paused reading.
  }

  void fail(const boost::system::error_code& ec, const char* what) {
    if (ec == asio::error::operation_aborted) return;
    if (ec == asio::error::eof) {
      spdlog::debug("store: connection {} from {} closed by the client", id_, peer_name());
    } else {
      spdlog::warn("store: connection {} from {}: {} failed: {}; dropping it", id_, peer_name(),
                   what, ec.message());
    }
    close();
  }

  std::string peer_name() const {
    return fmt::format("{}:{}", peer_.address().to_string(), peer_.port());
  }

  tcp::socket socket_;
  std::shared_ptr<TcpStoreService> service_;
  uint64_t id_;
  tcp::endpoint peer_;
  StoreProtocol protocol_;
  std::vector<char> inbox_;  ///< Bytes read and not yet consumed: [0, filled_).
  size_t filled_ = 0;
  std::string outbox_;   ///< Replies not yet handed to the socket.
  std::string sending_;  ///< Replies being written now.
  bool reading_ = false;
  bool writing_ = false;
  bool batching_ = false;  ///< Inside consume(): replies wait for the end of the batch.
  bool closed_ = false;
};

void TcpStoreService::stop() {
  stopped_ = true;
  listener_ = nullptr;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  accept_retry_.cancel();
  for (auto& [id, session] : sessions_) session->shut();
  sessions_.clear();
}

void TcpStoreService::reset() {
  for (auto& [id, session] : sessions_) session->shut();
  sessions_.clear();
  state_.clear();
}

void TcpStoreService::accept() {
  acceptor_.async_accept(
      [self = shared_from_this()](const boost::system::error_code& ec, tcp::socket socket) {
        if (self->stopped_ || ec == asio::error::operation_aborted) return;
        if (!ec) {
          self->admit(std::move(socket));
          return self->accept();
        }
        spdlog::warn("store: cannot accept a connection: {}; retrying in {} ms", ec.message(),
                     kAcceptRetryDelay.count());
        self->accept_retry_.expires_after(kAcceptRetryDelay);
        self->accept_retry_.async_wait([self](const boost::system::error_code& wait_ec) {
          if (!wait_ec && !self->stopped_) self->accept();
        });
      });
}

void TcpStoreService::admit(tcp::socket socket) {
  boost::system::error_code ec;
  const tcp::endpoint peer = socket.remote_endpoint(ec);
  if (ec) return;  // Gone before we got to it.
  socket.set_option(tcp::no_delay(true), ec);
  // Connections idle legitimately for a whole job; keepalive finds the peers whose host vanished.
  socket.set_option(asio::socket_base::keep_alive(true), ec);
  const uint64_t id = next_connection_++;
  auto session = std::make_shared<StoreSession>(std::move(socket), shared_from_this(), id, peer);
  sessions_.emplace(id, session);
  spdlog::debug("store: connection {} from {}:{}", id, peer.address().to_string(), peer.port());
  publish({StoreEvent::Kind::kConnected, id, peer, {}, 0});
  session->start();
}

void TcpStoreService::deliver(uint64_t connection, std::string_view bytes) {
  auto it = sessions_.find(connection);
  if (it != sessions_.end()) it->second->push(bytes);
}

void TcpStoreService::changed(StoreEvent::Kind kind, uint64_t connection, std::string_view key,
                              int64_t value) {
  if (!listener_) return;
  auto it = sessions_.find(connection);
  publish({kind, connection, it != sessions_.end() ? it->second->peer() : tcp::endpoint{},
           std::string(key), value});
}

void TcpStoreService::closed(const StoreSession& session) {
  state_.drop_connection(session.id());
  const StoreEvent event{StoreEvent::Kind::kDisconnected, session.id(), session.peer(), {}, 0};
  sessions_.erase(session.id());
  publish(event);
}

TcpStoreServer::TcpStoreServer(asio::io_context& io, tcp::acceptor acceptor, Listener listener)
    : service_(std::make_shared<TcpStoreService>(io, std::move(acceptor), std::move(listener))) {
  service_->start();
}

TcpStoreServer::~TcpStoreServer() { service_->stop(); }

unsigned short TcpStoreServer::port() const { return service_->port(); }

size_t TcpStoreServer::connection_count() const { return service_->connection_count(); }

const std::string* TcpStoreServer::value(std::string_view key) const {
  return service_->state().get(key);
}

void TcpStoreServer::set(std::string_view key, std::string_view value) {
  service_->state().set(0, key, value);  // Connection 0: no client; the listener hears it too.
}

void TcpStoreServer::reset() { service_->reset(); }

void TcpStoreServer::erase_prefix(std::string_view prefix) {
  StoreState& state = service_->state();
  std::vector<std::string> doomed;
  for (std::string_view key : state.keys())
    if (key.starts_with(prefix)) doomed.emplace_back(key);
  for (const std::string& key : doomed) state.erase(0, key);
}

}  // namespace mcprun
