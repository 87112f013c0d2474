#include "launcher/etcd/etcd_wire.hpp"

#include <openssl/evp.h>

#include <charconv>

namespace mcprun::etcd {

using json = nlohmann::json;

std::string base64_encode(std::string_view bytes) {
  std::string text(4 * ((bytes.size() + 2) / 3), '\0');
  const int written = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(text.data()),
                                      reinterpret_cast<const unsigned char*>(bytes.data()),
                                      static_cast<int>(bytes.size()));
  text.resize(static_cast<size_t>(written));
  return text;
}

Expected<std::string> base64_decode(std::string_view text) {
  // EVP_DecodeBlock skips surrounding blanks and keeps the padding as zero bytes: check first.
  const bool alphabet =
      text.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") ==
      std::string_view::npos;
  const size_t padding = text.ends_with("==") ? 2 : text.ends_with("=") ? 1 : 0;
  if (text.size() % 4 != 0 || !alphabet || text.find('=') < text.size() - padding)
    return Error{"not base64: '" + std::string(text.substr(0, 40)) + "'"};
  std::string bytes(text.size() / 4 * 3, '\0');
  const int decoded = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(bytes.data()),
                                      reinterpret_cast<const unsigned char*>(text.data()),
                                      static_cast<int>(text.size()));
  if (decoded < 0) return Error{"not base64: '" + std::string(text.substr(0, 40)) + "'"};
  bytes.resize(static_cast<size_t>(decoded) - padding);
  return bytes;
}

std::string prefix_range_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

Expected<int64_t> int64_field(const json& object, const char* name) {
  const auto field = object.find(name);
  if (field == object.end() || field->is_null()) return int64_t{0};
  if (field->is_number_integer()) return field->get<int64_t>();
  if (field->is_string()) {
    const auto& text = field->get_ref<const std::string&>();
    int64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error == std::errc() && end == text.data() + text.size() && !text.empty()) return value;
  }
  return Error{std::string("field \"") + name + "\" is not a 64-bit integer: " + field->dump()};
}

Expected<KeyValue> parse_key_value(const json& kv) {
  if (!kv.is_object()) return Error{"a kv that is not an object: " + kv.dump()};
  KeyValue out;
  for (auto [name, target] : {std::pair{"key", &out.key}, std::pair{"value", &out.value}}) {
    const auto field = kv.find(name);
    if (field == kv.end()) continue;  // An empty value is left out.
    if (!field->is_string()) return Error{std::string("kv field \"") + name + "\" is no string"};
    auto bytes = base64_decode(field->get_ref<const std::string&>());
    if (!bytes) return Error{std::string("kv field \"") + name + "\": " + bytes.error().message};
    *target = std::move(*bytes);
  }
  for (auto [name, target] : {std::pair{"create_revision", &out.create_revision},
                              std::pair{"mod_revision", &out.mod_revision},
                              std::pair{"version", &out.version}, std::pair{"lease", &out.lease}}) {
    auto number = int64_field(kv, name);
    if (!number) return number.error();
    *target = *number;
  }
  return out;
}

Expected<WatchResponse> parse_watch_response(std::string_view line) {
  const json object = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!object.is_object()) return Error{"a watch sent what is not JSON: " + std::string(line)};
  if (const auto error = object.find("error"); error != object.end())
    return Error{"the watch failed: " + error->value("message", error->dump())};
  const auto result = object.find("result");
  if (result == object.end() || !result->is_object())
    return Error{"a watch sent no result: " + std::string(line)};
  WatchResponse response;
  response.created = result->value("created", false);
  response.canceled = result->value("canceled", false);
  response.cancel_reason = result->value("cancel_reason", std::string());
  auto compact = int64_field(*result, "compact_revision");
  if (!compact) return compact.error();
  response.compact_revision = *compact;
  if (const auto header = result->find("header"); header != result->end()) {
    auto revision = int64_field(*header, "revision");
    if (!revision) return revision.error();
    response.revision = *revision;
  }
  for (const auto& event : result->value("events", json::array())) {
    WatchEvent out;
    out.type = event.value("type", std::string("PUT")) == "DELETE" ? WatchEvent::Type::kDelete
                                                                   : WatchEvent::Type::kPut;
    auto kv = parse_key_value(event.value("kv", json::object()));
    if (!kv) return kv.error();
    out.kv = std::move(*kv);
    response.events.push_back(std::move(out));
  }
  return response;
}

std::vector<std::string> WatchStreamSplitter::feed(std::string_view chunk) {
  pending_.append(chunk);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t end; (end = pending_.find('\n', start)) != std::string::npos; start = end + 1)
    if (end > start) lines.push_back(pending_.substr(start, end - start));
  pending_.erase(0, start);
  return lines;
}

}  // namespace mcprun::etcd
