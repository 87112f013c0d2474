// A client of an etcd cluster's v3 JSON gateway (HTTP/1.1 over Beast, TLS where asked): keys,
// transactions, leases and watches, each call bounded in time. It talks to one member at a time
// and moves to the next on any failure to answer, so that a dead, stopped or partitioned member
// costs one request deadline, never a hang. Blocking: a caller on an event loop runs it elsewhere.
// The gateway rather than gRPC (Debian's libgrpc++): Beast is already linked, nothing is generated
// at build time, and a rendezvous makes a few requests a second, where JSON's cost is nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/endpoint.hpp"
#include "common/expected.hpp"
#include "launcher/etcd/etcd_wire.hpp"

namespace mcprun::etcd {

/// How to reach the cluster: torchrun's --rdzv-endpoint list and its --rdzv-conf keys.
struct Settings {
  std::vector<Endpoint> members;  ///< "e1:2379,e2:2379,e3:2379", tried in turn.
  bool tls = false;               ///< protocol=https.
  std::string ca_file;            ///< cacert: verifies the members; empty: the system's CAs.
  std::string cert_file;          ///< cert and key: this client's certificate, when the
  std::string key_file;           ///< members ask for one.
  /// One member's answer. A SIGSTOPped member costs this once before the next is asked.
  std::chrono::milliseconds request_timeout{2000};
};

/// A transaction's outcome: whether its compare held, and the key as it is now when it did not.
struct TxnResult {
  bool succeeded = false;
  int64_t revision = 0;             ///< The store's revision after it.
  std::optional<KeyValue> current;  ///< When it failed: the key that made it fail, if any.
};

/// How a range is read: in key order, or by creation, and how much of it.
struct RangeOptions {
  enum class Order { kKeyAscending, kKeyDescending, kCreatedFirst };
  Order order = Order::kKeyAscending;
  int64_t limit = 0;       ///< At most this many keys; 0: all.
  bool keys_only = false;  ///< Without their values.
};

/// What a bounded watch saw.
struct WatchResult {
  std::vector<WatchEvent> events;
  int64_t revision = 0;  ///< Watch again from revision + 1 to miss nothing.
};

class Client {
 public:
  explicit Client(Settings settings);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// Every key under `prefix`, in key order, and the store's revision they were read at.
  Expected<std::vector<KeyValue>> range_prefix(std::string_view prefix, int64_t* revision = nullptr,
                                               RangeOptions options = {});
  /// How many keys lie under `prefix`, read without them.
  Expected<int64_t> count_prefix(std::string_view prefix);
  Expected<std::optional<KeyValue>> get(std::string_view key);
  /// Writes `key`; on `lease` (0: none), which deletes it when the lease expires.
  Expected<int64_t> put(std::string_view key, std::string_view value, int64_t lease = 0);
  /// Writes `key` only if it does not exist.
  Expected<TxnResult> create(std::string_view key, std::string_view value, int64_t lease = 0);
  /// Writes `key` only if it was last written at `mod_revision`.
  Expected<TxnResult> compare_and_swap(std::string_view key, int64_t mod_revision,
                                       std::string_view value, int64_t lease = 0);
  /// Deletes `key`; returns how many keys that was (0 or 1).
  Expected<int64_t> erase(std::string_view key);
  /// Deletes every key under `prefix`; returns how many.
  Expected<int64_t> delete_prefix(std::string_view prefix);

  /// A lease of `ttl` (etcd may raise it to its minimum); returns its ID.
  Expected<int64_t> grant_lease(std::chrono::seconds ttl);
  /// Refreshes the lease; returns the TTL it now has, 0 when it has expired.
  Expected<int64_t> keep_alive(int64_t lease);
  Expected<void> revoke(int64_t lease);

  /// The events on keys under `prefix` from `from_revision` on, waiting up to `limit` for the
  /// first: returns as soon as there are some, or empty at the limit.
  Expected<WatchResult> watch_prefix(std::string_view prefix, int64_t from_revision,
                                     std::chrono::milliseconds limit);
  /// The same for the keys from `key` up to, not including, `range_end` (empty: `key` alone).
  Expected<WatchResult> watch_range(std::string_view key, std::string_view range_end,
                                    int64_t from_revision, std::chrono::milliseconds limit);

  /// The member that answered last, "host:port".
  std::string member() const;
  /// This host's address on the last connection to a member: the interface that reaches the
  /// cluster. Empty before the first.
  const std::string& local_address() const { return local_address_; }
  /// Requests sent and bytes sent and received, over the client's life (watches included).
  uint64_t requests() const { return requests_; }
  uint64_t bytes() const { return bytes_; }

 private:
  struct Connection;
  /// POSTs `body` to `path` on the current member, then on each other member in turn; the first
  /// answer's JSON, or an error naming every member's failure.
  Expected<nlohmann::json> call(std::string_view path, const nlohmann::json& body);
  /// Runs `attempt(member_failed)` on the current member, then on each other in turn while the
  /// member is what failed; the first answer, or one line with every member's failure.
  template <class Attempt>
  auto across_members(const std::string& what, Attempt attempt)
      -> decltype(attempt(std::declval<bool&>()));
  /// One member's answer; `member_failed` says whether another member may answer better.
  Expected<nlohmann::json> call_member(std::string_view path, const std::string& body,
                                       bool& member_failed);
  Expected<WatchResult> watch_member(const std::string& body, std::chrono::milliseconds limit,
                                     bool& member_failed);
  Expected<TxnResult> transaction(std::string_view key, const nlohmann::json& compare,
                                  std::string_view value, int64_t lease);
  Expected<void> connect();

  Settings settings_;
  size_t current_ = 0;  ///< The member asked first.
  std::unique_ptr<Connection> connection_;
  std::string local_address_;
  uint64_t requests_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace mcprun::etcd
