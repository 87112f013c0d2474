// The requests torch 2.x's TCPStore client sends (torch/csrc/distributed/c10d/TCPStore.cpp and
// TCPStoreBackend.hpp): a one-byte query type, integers in host (little-endian) order, strings as
// a uint64 length and the bytes. Written apart from mcprun's store, so the two check each other.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace store_load {

/// torch 2.x's QueryType numbers for the calls the generator makes.
enum Query : uint8_t { kValidate = 0, kSet = 1, kGet = 3, kAdd = 4, kWait = 6, kPing = 13 };
/// VALIDATE's argument: torch's client refuses a server that does not take it.
constexpr uint32_t kValidationMagic = 0x3C85F7CE;
/// WAIT's reply once every key exists.
constexpr uint8_t kStopWaiting = 0;

template <class T>
void append_value(std::string& out, T value) {
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));
  out.append(raw, sizeof(T));
}

inline void append_bytes(std::string& out, std::string_view bytes) {
  append_value<uint64_t>(out, bytes.size());
  out.append(bytes);
}

/// torch 2.x's client puts "/" before every key (its PrefixStore-less root prefix).
inline void append_key(std::string& out, std::string_view key) {
  append_value<uint64_t>(out, key.size() + 1);
  out += '/';
  out.append(key);
}

inline std::string validate() {
  std::string out(1, static_cast<char>(kValidate));
  append_value<uint32_t>(out, kValidationMagic);
  return out;
}

inline std::string ping(uint32_t nonce) {
  std::string out(1, static_cast<char>(kPing));
  append_value<uint32_t>(out, nonce);
  return out;
}

inline std::string set(std::string_view key, std::string_view value) {
  std::string out(1, static_cast<char>(kSet));
  append_key(out, key);
  append_bytes(out, value);
  return out;
}

inline std::string add(std::string_view key, int64_t delta) {
  std::string out(1, static_cast<char>(kAdd));
  append_key(out, key);
  append_value<int64_t>(out, delta);
  return out;
}

inline std::string wait(const std::vector<std::string>& keys) {
  std::string out(1, static_cast<char>(kWait));
  append_value<uint64_t>(out, keys.size());
  for (const auto& key : keys) append_key(out, key);
  return out;
}

inline std::string get(std::string_view key) {
  std::string out(1, static_cast<char>(kGet));
  append_key(out, key);
  return out;
}

}  // namespace store_load
