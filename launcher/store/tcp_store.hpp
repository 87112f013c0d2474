// The job's c10d key-value store: a TCPStore server that speaks torch's own wire protocol, so
// every rank connects with a plain torch.distributed.TCPStore client, torch 1.x or 2.x alike.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mcprun {

/// What the store tells its observer, on the io thread, after the operation took effect.
struct StoreEvent {
  enum class Kind { kConnected, kDisconnected, kSet, kAdd, kDeleted };
  Kind kind;
  uint64_t connection = 0;              ///< Unique per accepted connection.
  boost::asio::ip::tcp::endpoint peer;  ///< The client's address and port.
  /// For kSet (SET, successful COMPARE_SET, APPEND, each MULTI_SET key), kAdd, kDeleted.
  std::string key;
  int64_t value = 0;  ///< For kAdd: the counter after the add.
};

/// Which numbering a connection's queries use, decided from its first bytes.
enum class StoreDialect {
  kUndecided,
  kTorch1,  ///< torch 1.x and 2.0: no handshake, SET is 0, WATCH_KEY is 7.
  kTorch2,  ///< Later 2.x: opens with VALIDATE (0) and the magic; SET is 1, adds PING, queues.
};

/// The uint32 that follows a torch 2.x client's opening VALIDATE.
inline constexpr uint32_t kStoreValidationMagic = 0x3C85F7CE;

/// Caps on what one request may declare, so a garbage length closes its connection instead of
/// making the server wait for (and buffer) gigabytes. torch's own libuv server allows 8 KiB keys
/// and 8 MiB values; these are looser, because torch 1.x had no limit at all.
inline constexpr uint64_t kMaxStoreKeyBytes = 64 * 1024;
inline constexpr uint64_t kMaxStoreValueBytes = 256 * 1024 * 1024;
inline constexpr uint64_t kMaxStoreRequestBytes = 512 * 1024 * 1024;

/// Lets string_view keys find std::string entries without building a string per request.
struct StoreKeyHash {
  using is_transparent = void;
  size_t operator()(std::string_view key) const { return std::hash<std::string_view>{}(key); }
};
template <class Value>
using StoreKeyMap = std::unordered_map<std::string, Value, StoreKeyHash, std::equal_to<>>;

/// Where StoreState sends what is not the reply to the request at hand; the server implements
/// it with its sockets, tests with a recorder.
class StoreOutlet {
 public:
  virtual ~StoreOutlet() = default;
  /// Bytes for `connection` outside its own request order: a wake-up or a watch notice.
  virtual void deliver(uint64_t connection, std::string_view bytes) = 0;
  /// `connection` changed `key` (kSet, kAdd with the new count, or kDeleted).
  virtual void changed(StoreEvent::Kind kind, uint64_t connection, std::string_view key,
                       int64_t value) = 0;
};

/// The keys, counters and queues of one store, and who waits on or watches which key. It knows
/// no sockets: StoreProtocol calls it, and it answers through return values and its outlet.
class StoreState {
 public:
  explicit StoreState(StoreOutlet& outlet) : outlet_(outlet) {}

  void set(uint64_t connection, std::string_view key, std::string_view value);
  /// torch's compare_set: stores `desired` when the value equals `expected`, or when the key is
  /// missing and `expected` is empty. Returns the value stored now, except that for a missing key
  /// and a non-empty `expected` it returns `expected`, as torch does. Valid until the next change.
  std::string_view compare_set(uint64_t connection, std::string_view key, std::string_view expected,
                               std::string_view desired);
  const std::string* get(std::string_view key) const;
  /// Adds to a counter kept as a decimal string; nullopt when the value there is not a number.
  std::optional<int64_t> add(uint64_t connection, std::string_view key, int64_t delta);
  void append(uint64_t connection, std::string_view key, std::string_view value);
  /// Whether a key existed and was removed.
  bool erase(uint64_t connection, std::string_view key);
  int64_t key_count() const { return static_cast<int64_t>(values_.size()); }
  std::vector<std::string_view> keys() const;

  /// Whether every key is present (a key also counts while its queue is not empty).
  bool check(const std::vector<std::string_view>& keys) const;
  /// True when `keys` are all present now. Otherwise `connection` waits, replacing a wait it left
  /// pending (torch 1.x clients never cancel one that timed out), and is sent STOP_WAITING later.
  bool wait(uint64_t connection, const std::vector<std::string_view>& keys);
  void cancel_wait(uint64_t connection);
  /// torch 2.x's barrier: counts arrivals at `key`. True for the arrival that completes it, which
  /// also wakes the earlier ones; nullopt when the value there is not a number.
  std::optional<bool> barrier(uint64_t connection, std::string_view key, int64_t world_size);
  /// torch 1.x's watch_key: `connection` is sent a notice on every change of `key`.
  void watch(uint64_t connection, std::string_view key);

  void queue_push(std::string_view key, std::string_view value);
  /// Takes the oldest value off the queue; nullopt when it is empty.
  std::optional<std::string> queue_pop(std::string_view key);
  int64_t queue_length(std::string_view key) const;

  /// Forgets everything `connection` waited on or watched; it has closed.
  void drop_connection(uint64_t connection);
  /// Forgets every key, queue, wait and watch.
  void clear();
  size_t waiter_count() const { return waiters_.size(); }

 private:
  /// One connection's pending wait: how many keys are still missing, and which it is listed under.
  struct Waiter {
    size_t missing = 0;
    std::vector<std::string> keys;
  };
  bool present(std::string_view key) const;
  void add_waiter(uint64_t connection, const std::vector<std::string_view>& keys);
  void remove_waiter(uint64_t connection);
  /// Wakes every waiter of `key`, or (a queue push) only the first one it completes.
  void wake(std::string_view key, bool only_one = false);
  /// Sends a torch 1.x watch notice to every watcher of `key`.
  void notify(std::string_view key, uint8_t notice, std::string_view old_value,
              std::string_view new_value);
  bool watched(std::string_view key) const { return !watchers_.empty() && watchers_.count(key); }

  StoreOutlet& outlet_;
  StoreKeyMap<std::string> values_;
  StoreKeyMap<std::deque<std::string>> queues_;
  StoreKeyMap<std::vector<uint64_t>> waiting_on_;  ///< key -> connections waiting for it.
  std::unordered_map<uint64_t, Waiter> waiters_;
  StoreKeyMap<std::vector<uint64_t>> watchers_;  ///< key -> connections watching it.
  std::unordered_map<uint64_t, std::vector<std::string>> watched_by_;  ///< For dropping a watcher.
};

/// One connection's side of the wire protocol, without the socket: decides the dialect, parses
/// requests incrementally from whatever bytes have arrived, and appends the replies.
class StoreProtocol {
 public:
  StoreProtocol(StoreState& state, uint64_t connection) : state_(state), connection_(connection) {}

  /// Executes every complete request at the front of `input`, appending replies to `replies`, and
  /// returns how many bytes that used. The rest is an incomplete request, unless failed().
  size_t consume(std::string_view input, std::string& replies);
  /// The peer sent something that ends the connection; error() says what.
  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }
  StoreDialect dialect() const { return dialect_; }

 private:
  class Reader;
  /// One request from `reader`; false when it is incomplete, or bad (error_ then says why).
  bool execute(Reader& reader, std::string& replies);
  /// Appends a GET-style value; a missing key is an error in torch 1.x and empty in 2.x.
  bool reply_value(std::string_view key, std::string& replies);

  StoreState& state_;
  uint64_t connection_;
  StoreDialect dialect_ = StoreDialect::kUndecided;
  std::string error_;
  std::vector<std::string_view> keys_;  ///< Reused by multi-key requests.
};

/// The acceptor, state and sessions behind a TcpStoreServer, shared with the handlers that may
/// still be queued after the server is gone (defined in tcp_store.cpp).
class TcpStoreService;

/// Serves a StoreState over TCP: single-threaded on the caller's io_context, one session per
/// connection, replies batched per read.
class TcpStoreServer {
 public:
  using Listener = std::function<void(const StoreEvent&)>;
  /// Serves on an acceptor that is open and bound (listen() is called here if needed).
  TcpStoreServer(boost::asio::io_context& io, boost::asio::ip::tcp::acceptor acceptor,
                 Listener listener = {});
  /// Closes the acceptor and every connection; safe with handlers still queued.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  unsigned short port() const;
  size_t connection_count() const;
  /// The value stored under `key`, or nullptr: how mcprun reads what its workers' reporters set.
  const std::string* value(std::string_view key) const;
  /// Stores `value` under `key` as a client's SET would, waking its waiters: how mcprun asks
  /// the workers' reporters for something.
  void set(std::string_view key, std::string_view value);
  /// Closes every connection and forgets every key, keeping the listening socket: a new store
  /// on the same port.
  void reset();
  /// Forgets every key under `prefix`, connections kept: what a check run before the job wrote.
  void erase_prefix(std::string_view prefix);

 private:
  std::shared_ptr<TcpStoreService> service_;
};

}  // namespace mcprun
