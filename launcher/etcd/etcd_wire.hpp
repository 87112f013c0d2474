// etcd's v3 JSON gateway as bytes on the wire: base64 keys and values, 64-bit numbers that arrive
// as strings, fields at their default value left out, and a watch that streams newline-separated
// JSON objects whose boundaries fall anywhere in a chunk. Pure: etcd_client does the talking.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/expected.hpp"

namespace mcprun::etcd {

std::string base64_encode(std::string_view bytes);
/// The bytes of base64 `text`; an error for anything that is not base64.
Expected<std::string> base64_decode(std::string_view text);

/// The end of the range that holds every key under `prefix`: its last byte plus one, carried past
/// 0xff bytes ("\0" when every byte is 0xff: every key from the prefix on).
std::string prefix_range_end(std::string_view prefix);

/// A 64-bit field that etcd writes as a string ("42") or a number, or leaves out at its default
/// (0). An error names the field.
Expected<int64_t> int64_field(const nlohmann::json& object, const char* name);

/// One key as etcd holds it.
struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;  ///< 0: on no lease.
  bool operator==(const KeyValue&) const = default;
};

/// A "kv" object: base64 key and value, string revisions.
Expected<KeyValue> parse_key_value(const nlohmann::json& kv);

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  ///< For a delete: the key and the revision that deleted it.
};

/// One object of a watch's stream: the watch was created, or events, or why it ended.
struct WatchResponse {
  bool created = false;
  bool canceled = false;
  int64_t revision = 0;          ///< The store's revision when etcd sent it (its header).
  int64_t compact_revision = 0;  ///< Set when the asked-for revision was compacted away.
  std::string cancel_reason;
  std::vector<WatchEvent> events;
};

/// A line of the stream: {"result": {...}}, or {"error": {...}} (returned as an error).
Expected<WatchResponse> parse_watch_response(std::string_view line);

/// Cuts a watch's body into its objects, which etcd ends with newlines: a chunk may stop inside
/// one object or hold several.
class WatchStreamSplitter {
 public:
  /// Takes the next chunk; returns the objects it completed, in order.
  std::vector<std::string> feed(std::string_view chunk);
  size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string pending_;
};

}  // namespace mcprun::etcd
