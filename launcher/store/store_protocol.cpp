// StoreProtocol: one connection's requests parsed from its bytes and executed on the state.
#include <algorithm>
#include <array>

#include "common/logging.hpp"
#include "launcher/store/store_wire.hpp"
#include "launcher/store/tcp_store.hpp"

// The wire format is torch's tcputil: a one-byte query type, then its arguments. Integers go in
// host byte order (torch clients and servers are little endian in practice, and so is this
// server), strings and byte vectors as a uint64 length and the bytes. Sources, for each query's
// arguments and reply: torch/csrc/distributed/c10d/TCPStore.cpp (client), TCPStoreBackend.cpp
// and TCPStoreLibUvBackend.cpp (servers), and in torch 1.x the daemon inside TCPStore.cpp.

namespace mcprun {
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

}  // namespace

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

}  // namespace mcprun
