// The pieces of torch's TCPStore wire format that both the store's state (wake-ups and watch
// notices it sends on its own) and its protocol (replies) write.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace mcprun {

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
inline void append_value(std::string& out, T value) {
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));
  out.append(raw, sizeof(T));
}

inline void append_bytes(std::string& out, std::string_view bytes) {
  append_value<uint64_t>(out, bytes.size());
  out.append(bytes);
}

}  // namespace mcprun
