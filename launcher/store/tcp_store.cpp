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

#include "common/logging.hpp"

// The wire format is torch's tcputil: a one-byte query type, then its arguments. Integers go in
// host byte order (torch clients and servers are little endian in practice, and so is this
// server), strings and byte vectors as a uint64 length and the bytes. Sources, for each query's
// arguments and reply: torch/csrc/distributed/c10d/TCPStore.cpp (client), TCPStoreBackend.cpp
// and TCPStoreLibUvBackend.cpp (servers), and in torch 1.x the daemon inside TCPStore.cpp.

namespace mcprun {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

/// What the store can be asked, whatever number a dialect gives it.
enum class Query {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kNumKeys,
  kWatchKey,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kListKeys,
  kBarrier,
  kUnknown
};

/// torch 1.x's QueryType (also torch 2.0's).
constexpr std::array kTorch1Queries{Query::kSet,     Query::kCompareSet, Query::kGet,
                                    Query::kAdd,     Query::kCheck,      Query::kWait,
                                    Query::kNumKeys, Query::kWatchKey,   Query::kDeleteKey};

/// torch 2.x's QueryType (TCPStoreBackend.hpp) since VALIDATE came (pytorch#107607): WATCH_KEY is
/// gone (pytorch#105014), APPEND to CANCEL_WAIT were added before, PING to BARRIER after.
constexpr std::array kTorch2Queries{
    Query::kValidate, Query::kSet,      Query::kCompareSet, Query::kGet,       Query::kAdd,
    Query::kCheck,    Query::kWait,     Query::kNumKeys,    Query::kDeleteKey, Query::kAppend,
    Query::kMultiGet, Query::kMultiSet, Query::kCancelWait, Query::kPing,      Query::kQueuePush,
    Query::kQueuePop, Query::kQueueLen, Query::kListKeys,   Query::kBarrier};

Query decode_query(StoreDialect dialect, uint8_t code) {
  if (dialect == StoreDialect::kTorch1)
    return code < kTorch1Queries.size() ? kTorch1Queries[code] : Query::kUnknown;
  return code < kTorch2Queries.size() ? kTorch2Queries[code] : Query::kUnknown;
}

const char* query_name(Query query) {
  constexpr std::array kNames{"VALIDATE",   "SET",       "COMPARE_SET", "GET",         "ADD",
                              "CHECK",      "WAIT",      "GETNUMKEYS",  "WATCH_KEY",   "DELETE_KEY",
                              "APPEND",     "MULTI_GET", "MULTI_SET",   "CANCEL_WAIT", "PING",
                              "QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN",   "LIST_KEYS",   "BARRIER",
                              "unknown"};
  return kNames[static_cast<size_t>(query)];
}

/// torch's WaitResponseType and CheckResponseType, one byte each.
constexpr char kStopWaiting = 0, kWaitCanceled = 1;
constexpr char kReady = 0, kNotReady = 1;

/// torch 1.x's WatchResponseType, the first byte of each message on a watch_key connection.
enum WatchNotice : uint8_t {
  kKeyUpdated = 0,
  kKeyCreated = 1,
  kKeyDeleted = 2,
  kCallbackRegistered = 3,
  kKeyAppended = 4,  ///< An APPEND (from a torch 2.x client) to a watched key.
};

template <class T>
void append_value(std::string& out, T value) {
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));
  out.append(raw, sizeof(T));
}

void append_bytes(std::string& out, std::string_view bytes) {
  append_value<uint64_t>(out, bytes.size());
  out.append(bytes);
}

/// The counter in `value` as torch reads it with std::stoll: leading blanks, a sign and digits,
/// anything after them ignored; nullopt when there is no number or it does not fit.
std::optional<int64_t> parse_counter(const std::string& value) {
  errno = 0;
  char* end = nullptr;
  const long long number = std::strtoll(value.c_str(), &end, 10);
  if (end == value.c_str() || errno == ERANGE) return std::nullopt;
  return number;
}

/// Two's-complement addition, as torch's counters overflow in practice, without the UB.
int64_t wrapping_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

template <class Value>
Value& entry(StoreKeyMap<Value>& map, std::string_view key) {
  auto it = map.find(key);
  if (it == map.end()) it = map.emplace(std::string(key), Value{}).first;
  return it->second;
}

}  // namespace

// --- StoreState ---------------------------------------------------------------------------------

void StoreState::set(uint64_t connection, std::string_view key, std::string_view value) {
  auto it = values_.find(key);
  const bool created = it == values_.end();
  if (watched(key))
    notify(key, created ? kKeyCreated : kKeyUpdated, created ? "" : it->second, value);
  if (created) {
    values_.emplace(std::string(key), std::string(value));
  } else {
    it->second.assign(value);
  }
  wake(key);
  outlet_.changed(StoreEvent::Kind::kSet, connection, key, 0);
}

std::string_view StoreState::compare_set(uint64_t connection, std::string_view key,
                                         std::string_view expected, std::string_view desired) {
  auto it = values_.find(key);
  if (it == values_.end()) {
    if (!expected.empty()) return expected;
    if (watched(key)) notify(key, kKeyCreated, "", desired);
    it = values_.emplace(std::string(key), std::string(desired)).first;
  } else {
    if (it->second != expected) return it->second;
    if (watched(key)) notify(key, kKeyUpdated, it->second, desired);
    it->second.assign(desired);
  }
  // torch itself forgets this wake-up, leaving a waiter on a key made by compare_set hanging.
  wake(key);
  outlet_.changed(StoreEvent::Kind::kSet, connection, key, 0);
  return it->second;
}

const std::string* StoreState::get(std::string_view key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

std::optional<int64_t> StoreState::add(uint64_t connection, std::string_view key, int64_t delta) {
  auto it = values_.find(key);
  int64_t total = delta;
  if (it != values_.end()) {
    auto current = parse_counter(it->second);
    if (!current) return std::nullopt;
    total = wrapping_add(*current, delta);
  }
  std::string text = std::to_string(total);
  if (watched(key))
    notify(key, it == values_.end() ? kKeyCreated : kKeyUpdated,
           it == values_.end() ? "" : it->second, text);
  if (it == values_.end()) {
    values_.emplace(std::string(key), std::move(text));
  } else {
    it->second = std::move(text);
  }
  wake(key);
  outlet_.changed(StoreEvent::Kind::kAdd, connection, key, total);
  return total;
}

void StoreState::append(uint64_t connection, std::string_view key, std::string_view value) {
  auto it = values_.find(key);
  const bool created = it == values_.end();
  // As torch's server did while it had both: the appended bytes stand as the new value.
  if (watched(key)) notify(key, created ? kKeyCreated : kKeyAppended, "", value);
  if (created) {
    values_.emplace(std::string(key), std::string(value));
  } else {
    it->second.append(value);
  }
  wake(key);
  outlet_.changed(StoreEvent::Kind::kSet, connection, key, 0);
}

bool StoreState::erase(uint64_t connection, std::string_view key) {
  auto it = values_.find(key);
  if (it == values_.end()) return false;
  if (watched(key)) notify(key, kKeyDeleted, it->second, "");
  values_.erase(it);
  outlet_.changed(StoreEvent::Kind::kDeleted, connection, key, 0);
  return true;
}

std::vector<std::string_view> StoreState::keys() const {
  std::vector<std::string_view> names;
  names.reserve(values_.size());
  for (const auto& [key, value] : values_) names.push_back(key);
  return names;
}

bool StoreState::present(std::string_view key) const {
  if (values_.count(key)) return true;
  auto queue = queues_.find(key);
  return queue != queues_.end() && !queue->second.empty();
}

bool StoreState::check(const std::vector<std::string_view>& keys) const {
  return std::all_of(keys.begin(), keys.end(),
                     [this](std::string_view key) { return present(key); });
}

bool StoreState::wait(uint64_t connection, const std::vector<std::string_view>& keys) {
  if (check(keys)) return true;
  add_waiter(connection, keys);
  return false;
}

void StoreState::add_waiter(uint64_t connection, const std::vector<std::string_view>& keys) {
  remove_waiter(connection);
  Waiter waiter;
  for (std::string_view key : keys) {
    if (present(key) || std::find(waiter.keys.begin(), waiter.keys.end(), key) != waiter.keys.end())
      continue;
    waiter.keys.emplace_back(key);
    entry(waiting_on_, key).push_back(connection);
  }
  waiter.missing = waiter.keys.size();
  waiters_.emplace(connection, std::move(waiter));
}

void StoreState::cancel_wait(uint64_t connection) { remove_waiter(connection); }

void StoreState::remove_waiter(uint64_t connection) {
  auto waiter = waiters_.find(connection);
  if (waiter == waiters_.end()) return;
  for (const std::string& key : waiter->second.keys) {
    auto list = waiting_on_.find(key);
    if (list == waiting_on_.end()) continue;  // That key has been set already.
    std::erase(list->second, connection);
    if (list->second.empty()) waiting_on_.erase(list);
  }
  waiters_.erase(waiter);
}

void StoreState::wake(std::string_view key, bool only_one) {
  auto list = waiting_on_.find(key);
  if (list == waiting_on_.end()) return;
  std::vector<uint64_t> connections = std::move(list->second);
  waiting_on_.erase(list);
  size_t next = 0;
  while (next < connections.size()) {
    auto waiter = waiters_.find(connections[next++]);
    if (waiter == waiters_.end() || --waiter->second.missing > 0) continue;
    const uint64_t connection = waiter->first;
    waiters_.erase(waiter);
    outlet_.deliver(connection, std::string_view(&kStopWaiting, 1));
    if (only_one) break;
  }
  // A queue push woke one waiter; the others keep waiting for the next push.
  if (next < connections.size())
    waiting_on_.emplace(
        std::string(key),
        std::vector<uint64_t>(connections.begin() + static_cast<std::ptrdiff_t>(next),
                              connections.end()));
}

std::optional<bool> StoreState::barrier(uint64_t connection, std::string_view key,
                                        int64_t world_size) {
  auto it = values_.find(key);
  int64_t count = 1;
  if (it != values_.end()) {
    auto current = parse_counter(it->second);
    if (!current) return std::nullopt;
    count = wrapping_add(*current, 1);
  }
  std::string text = std::to_string(count);
  if (it == values_.end()) {
    values_.emplace(std::string(key), std::move(text));
  } else {
    it->second = std::move(text);
  }
  outlet_.changed(StoreEvent::Kind::kAdd, connection, key, count);
  // Earlier arrivals wait on the key itself, so only the last arrival may wake them.
  if (count >= world_size) {
    wake(key);
    return true;
  }
  remove_waiter(connection);
  waiters_.emplace(connection, Waiter{1, {std::string(key)}});
  entry(waiting_on_, key).push_back(connection);
  return false;
}

void StoreState::watch(uint64_t connection, std::string_view key) {
  entry(watchers_, key).push_back(connection);
  watched_by_[connection].emplace_back(key);
}

void StoreState::notify(std::string_view key, uint8_t notice, std::string_view old_value,
                        std::string_view new_value) {
  std::string message(1, static_cast<char>(notice));
  append_bytes(message, key);
  append_bytes(message, old_value);
  append_bytes(message, new_value);
  for (uint64_t connection : watchers_.find(key)->second) outlet_.deliver(connection, message);
}

void StoreState::queue_push(std::string_view key, std::string_view value) {
  entry(queues_, key).emplace_back(value);
  wake(key, /*only_one=*/true);
}

std::optional<std::string> StoreState::queue_pop(std::string_view key) {
  auto queue = queues_.find(key);
  if (queue == queues_.end()) return std::nullopt;
  std::string value = std::move(queue->second.front());
  queue->second.pop_front();
  if (queue->second.empty()) queues_.erase(queue);
  return value;
}

int64_t StoreState::queue_length(std::string_view key) const {
  auto queue = queues_.find(key);
  return queue == queues_.end() ? 0 : static_cast<int64_t>(queue->second.size());
}

void StoreState::drop_connection(uint64_t connection) {
  remove_waiter(connection);
  auto watched = watched_by_.find(connection);
  if (watched == watched_by_.end()) return;
  for (const std::string& key : watched->second) {
    auto list = watchers_.find(key);
    if (list == watchers_.end()) continue;
    std::erase(list->second, connection);
    if (list->second.empty()) watchers_.erase(list);
  }
  watched_by_.erase(watched);
}

void StoreState::clear() {
  values_.clear();
  queues_.clear();
  waiting_on_.clear();
  waiters_.clear();
  watchers_.clear();
  watched_by_.clear();
}

// --- StoreProtocol ------------------------------------------------------------------------------

/// Reads one request's fields from the bytes that have arrived. A read past the end returns false
/// with no error (wait for more); a length over its cap returns false with error() set.
class StoreProtocol::Reader {
 public:
  explicit Reader(std::string_view input) : input_(input) {}

  template <class T>
  bool value(T& out) {
    if (!available(sizeof(T))) return false;
    std::memcpy(&out, input_.data() + used_, sizeof(T));
    used_ += sizeof(T);
    return true;
  }
  /// A string or byte vector as tcputil sends it: uint64 length, then the bytes.
  bool bytes(std::string_view& out, uint64_t limit, const char* what) {
    uint64_t length = 0;
    if (!value(length)) return false;
    if (length > limit) {
      error_ = fmt::format("{} length {} exceeds the limit of {} bytes", what, length, limit);
      return false;
    }
    if (!available(length)) return false;
    out = input_.substr(used_, length);
    used_ += length;
    return true;
  }
  bool key(std::string_view& out) { return bytes(out, kMaxStoreKeyBytes, "key"); }
  bool payload(std::string_view& out) { return bytes(out, kMaxStoreValueBytes, "value"); }
  /// A count of keys, each of which takes at least its 8-byte length: that bounds a sane count.
  bool count(uint64_t& out) {
    if (!value(out)) return false;
    if (out > kMaxStoreRequestBytes / sizeof(uint64_t)) {
      error_ = fmt::format("key count {} exceeds the request size limit", out);
      return false;
    }
    return true;
  }
  size_t used() const { return used_; }
  const std::string& error() const { return error_; }

 private:
  bool available(uint64_t n) {
    if (input_.size() - used_ >= n) return true;
    if (used_ + n > kMaxStoreRequestBytes)
      error_ = fmt::format("request exceeds the limit of {} bytes", kMaxStoreRequestBytes);
    return false;
  }

  std::string_view input_;
  size_t used_ = 0;
  std::string error_;
};

size_t StoreProtocol::consume(std::string_view input, std::string& replies) {
  size_t used = 0;
  while (!failed() && used < input.size()) {
    std::string_view rest = input.substr(used);
    if (dialect_ == StoreDialect::kUndecided) {
      // torch 2.x opens with VALIDATE (0) and the magic; torch 1.x with a query whose byte 0
      // (SET) is followed by an 8-byte key length, which can never spell the magic under the cap.
      uint32_t magic = 0;
      if (rest[0] == 0 && rest.size() < 1 + sizeof magic) break;
      if (rest[0] == 0) std::memcpy(&magic, rest.data() + 1, sizeof magic);
      dialect_ = magic == kStoreValidationMagic ? StoreDialect::kTorch2 : StoreDialect::kTorch1;
      spdlog::debug("store: connection {} speaks torch {}", connection_,
                    dialect_ == StoreDialect::kTorch2 ? "2.x" : "1.x");
      if (dialect_ == StoreDialect::kTorch2) {
        used += 1 + sizeof magic;
        continue;
      }
    }
    Reader reader(rest);
    if (!execute(reader, replies)) break;
    used += reader.used();
  }
  return used;
}

bool StoreProtocol::reply_value(std::string_view key, std::string& replies) {
  if (const std::string* value = state_.get(key)) {
    append_bytes(replies, *value);
  } else if (dialect_ == StoreDialect::kTorch2) {
    append_bytes(replies, "");  // As torch 2.x's default (libuv) server answers.
  } else {
    // torch 1.x's server drops the connection too; its clients wait for a key before a get.
    error_ = fmt::format("get of missing key '{}'", key);
    return false;
  }
  return true;
}

bool StoreProtocol::execute(Reader& in, std::string& replies) {
  uint8_t code = 0;
  if (!in.value(code)) return false;
  const Query query = decode_query(dialect_, code);
  if (query == Query::kUnknown || query == Query::kValidate) {
    error_ = fmt::format("unknown query type {} from a torch {} client", code,
                         dialect_ == StoreDialect::kTorch1 ? "1.x" : "2.x");
    return false;
  }

  // First every argument, so that a request is acted on only once it has arrived whole.
  keys_.clear();
  std::string_view key, value, expected;
  int64_t number = 0;
  uint32_t nonce = 0;
  uint64_t count = 0;
  bool complete = false;
  switch (query) {
    case Query::kSet:
    case Query::kAppend:
    case Query::kQueuePush:
      complete = in.key(key) && in.payload(value);
      break;
    case Query::kCompareSet:
      complete = in.key(key) && in.payload(expected) && in.payload(value);
      break;
    case Query::kAdd:
    case Query::kBarrier:
      complete = in.key(key) && in.value(number);
      break;
    case Query::kGet:
    case Query::kDeleteKey:
    case Query::kQueuePop:
    case Query::kQueueLen:
    case Query::kWatchKey:
      complete = in.key(key);
      break;
    case Query::kCheck:
    case Query::kWait:
    case Query::kMultiGet:
    case Query::kMultiSet:
      complete = in.count(count);
      for (uint64_t i = 0; complete && i < count; ++i) {
        complete = in.key(keys_.emplace_back());
        if (complete && query == Query::kMultiSet) complete = in.payload(keys_.emplace_back());
      }
      break;
    case Query::kPing:
      complete = in.value(nonce);
      break;
    case Query::kNumKeys:
    case Query::kCancelWait:
    case Query::kListKeys:
      complete = true;
      break;
    case Query::kValidate:
    case Query::kUnknown:
      break;  // Refused above.
  }
  if (!complete) {
    error_ = in.error();
    return false;
  }
  spdlog::debug("store: connection {}: {} {}", connection_, query_name(query),
                key.empty() && !keys_.empty() ? keys_.front() : key);

  switch (query) {
    case Query::kSet:
      state_.set(connection_, key, value);
      break;
    case Query::kCompareSet:
      append_bytes(replies, state_.compare_set(connection_, key, expected, value));
      break;
    case Query::kGet:
      return reply_value(key, replies);
    case Query::kAdd:
      if (auto total = state_.add(connection_, key, number)) {
        append_value<int64_t>(replies, *total);
        break;
      }
      error_ = fmt::format("add to key '{}', whose value is not a number", key);
      return false;
    case Query::kCheck:
      replies.push_back(state_.check(keys_) ? kReady : kNotReady);
      break;
    case Query::kWait:
      if (state_.wait(connection_, keys_)) replies.push_back(kStopWaiting);
      break;
    case Query::kNumKeys:
      append_value<int64_t>(replies, state_.key_count());
      break;
    case Query::kWatchKey:
      state_.watch(connection_, key);
      replies.push_back(static_cast<char>(kCallbackRegistered));
      break;
    case Query::kDeleteKey:
      append_value<int64_t>(replies, state_.erase(connection_, key) ? 1 : 0);
      break;
    case Query::kAppend:
      state_.append(connection_, key, value);
      break;
    case Query::kMultiGet:
      for (std::string_view each : keys_)
        if (!reply_value(each, replies)) return false;
      break;
    case Query::kMultiSet:
      for (size_t i = 0; i + 1 < keys_.size(); i += 2)
        state_.set(connection_, keys_[i], keys_[i + 1]);
      break;
    case Query::kCancelWait:
      state_.cancel_wait(connection_);
      replies.push_back(kWaitCanceled);
      break;
    case Query::kPing:
      append_value<uint32_t>(replies, nonce);
      break;
    case Query::kQueuePush:
      state_.queue_push(key, value);
      break;
    case Query::kQueuePop: {
      // The length before the pop; a client that finds 0 raises "queue is empty".
      append_value<int64_t>(replies, state_.queue_length(key));
      if (auto popped = state_.queue_pop(key)) append_bytes(replies, *popped);
      break;
    }
    case Query::kQueueLen:
      append_value<int64_t>(replies, state_.queue_length(key));
      break;
    case Query::kListKeys: {
      const auto names = state_.keys();
      append_value<int64_t>(replies, static_cast<int64_t>(names.size()));
      for (std::string_view name : names) append_bytes(replies, name);
      break;
    }
    case Query::kBarrier: {
      auto done = state_.barrier(connection_, key, number);
      if (!done) {
        error_ = fmt::format("barrier on key '{}', whose value is not a number", key);
        return false;
      }
      if (*done) replies.push_back(kStopWaiting);
      break;
    }
    case Query::kValidate:
    case Query::kUnknown:
      break;  // Refused above.
  }
  return true;
}

// --- TcpStoreServer -----------------------------------------------------------------------------

namespace {

/// A connection's read buffer to begin with; it grows for a request larger than this.
constexpr size_t kReadBufferBytes = 64 * 1024;
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
    if (!listening) acceptor_.listen(asio::socket_base::max_listen_connections);
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
    if (sending_.capacity() > 16 * kReadBufferBytes) {
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
