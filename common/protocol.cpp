#include "common/protocol.hpp"

#include <algorithm>
#include <fstream>

namespace mcprun {

std::string encode_frame(nlohmann::json message) {
  message["v"] = kProtocolVersion;
  // A string that is not UTF-8 is replaced, not thrown about: no peer's text can stop a send.
  std::string payload = message.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const auto length = static_cast<uint32_t>(payload.size());
  std::string frame(kFrameHeaderBytes, '\0');
  for (size_t i = 0; i < kFrameHeaderBytes; ++i)
    frame[i] = static_cast<char>((length >> (8 * (kFrameHeaderBytes - 1 - i))) & 0xff);
  return frame + payload;
}

namespace {

/// How deep the payload's arrays and objects nest, counted without parsing, up to `limit` + 1.
size_t nesting_depth(std::string_view payload, size_t limit) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : payload) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) break;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

FrameResult decode_frame(std::string_view buffer) {
  if (buffer.size() < kFrameHeaderBytes) return FrameIncomplete{kFrameHeaderBytes - buffer.size()};
  uint32_t length = 0;
  for (size_t i = 0; i < kFrameHeaderBytes; ++i)
    length = (length << 8) | static_cast<unsigned char>(buffer[i]);
  if (length > kMaxFrameBytes)
    return FrameError{"frame of " + std::to_string(length) + " bytes exceeds the " +
                      std::to_string(kMaxFrameBytes) + "-byte limit"};
  if (buffer.size() < kFrameHeaderBytes + length)
    return FrameIncomplete{kFrameHeaderBytes + length - buffer.size()};
  const std::string_view payload = buffer.substr(kFrameHeaderBytes, length);
  // Copying, printing and freeing a JSON value recurse: a deep one would exhaust the stack.
  if (nesting_depth(payload, kMaxNesting) > kMaxNesting)
    return FrameError{"payload nests deeper than " + std::to_string(kMaxNesting) + " levels"};
  nlohmann::json message = nlohmann::json::parse(payload, nullptr,
                                                 /*allow_exceptions=*/false);
  if (message.is_discarded()) return FrameError{"payload is not JSON"};
  if (!message.is_object()) return FrameError{"payload is not a JSON object"};
  auto version = message.find("v");
  if (version == message.end() || !version->is_number_integer())
    return FrameError{"message has no protocol version \"v\""};
  if (*version != kProtocolVersion)
    return FrameError{"protocol version " + version->dump() + " is not the supported " +
                      std::to_string(kProtocolVersion)};
  auto type = message.find("type");
  if (type == message.end() || !type->is_string())
    return FrameError{"message has no string \"type\""};
  return Frame{std::move(message), kFrameHeaderBytes + length};
}

std::optional<std::string> read_token_file(const std::string& path) {
  std::ifstream in(path);
  std::string token;
  if (!in || !std::getline(in, token) || token.empty()) return std::nullopt;
  return token;
}

bool tokens_equal(std::string_view presented, std::string_view expected) {
  // Fold every byte (and the length difference) in, so timing says nothing about the token.
  unsigned char difference = presented.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < presented.size(); ++i)
    difference |= static_cast<unsigned char>(presented[i]) ^
                  static_cast<unsigned char>(expected.empty() ? 0 : expected[i % expected.size()]);
  return difference == 0;
}

}  // namespace mcprun
