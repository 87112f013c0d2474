#include "launcher/etcd/etcd_wire.hpp"

#include <gtest/gtest.h>

namespace mcprun::etcd {
namespace {

TEST(EtcdWire, Base64RoundTripsEveryByteAndRefusesWhatIsNotBase64) {
  std::string bytes;
  for (int byte = 0; byte < 256; ++byte) bytes.push_back(static_cast<char>(byte));
  for (size_t size : {0u, 1u, 2u, 3u, 4u, 255u, 256u})
    EXPECT_EQ(*base64_decode(base64_encode(bytes.substr(0, size))), bytes.substr(0, size));
  EXPECT_EQ(base64_encode("/mcprun/job42/"), "L21jcHJ1bi9qb2I0Mi8=");
  for (const char* bad : {"abc", "ab=c", "a b=", "////=AAA", "é123"})
    EXPECT_FALSE(base64_decode(bad)) << bad;
}

TEST(EtcdWire, APrefixRangeEndsAtItsLastByteCarried) {
  EXPECT_EQ(prefix_range_end("/job/"), "/job0");
  EXPECT_EQ(prefix_range_end(std::string("a\xff", 2)), "b");
  EXPECT_EQ(prefix_range_end(std::string("\xff\xff", 2)), std::string(1, '\0'));
}

TEST(EtcdWire, SixtyFourBitFieldsArriveAsStringsOrNotAtAll) {
  const auto object = nlohmann::json::parse(R"({"a": "9007199254740993", "b": 7, "c": "x"})");
  EXPECT_EQ(*int64_field(object, "a"), 9007199254740993);  // Beyond a double's integers.
  EXPECT_EQ(*int64_field(object, "b"), 7);
  EXPECT_EQ(*int64_field(object, "missing"), 0);
  EXPECT_NE(int64_field(object, "c").error().message.find("\"c\""), std::string::npos);
}

TEST(EtcdWire, AKeyValueLeavesOutWhatIsAtItsDefault) {
  auto kv = parse_key_value(nlohmann::json::parse(
      R"({"key": "YQ==", "create_revision": "5", "mod_revision": "6", "version": "2"})"));
  ASSERT_TRUE(kv);
  EXPECT_EQ(kv->key, "a");
  EXPECT_EQ(kv->value, "");
  EXPECT_EQ(kv->mod_revision, 6);
  EXPECT_EQ(kv->lease, 0);
  EXPECT_FALSE(parse_key_value(nlohmann::json::parse(R"({"key": "not base64!"})")));
}

TEST(EtcdWire, AWatchStreamIsCutAtNewlinesWhereverTheChunksEnd) {
  const std::string stream =
      R"({"result":{"header":{"revision":"3"},"created":true}})"
      "\n"
      R"({"result":{"header":{"revision":"4"},"events":[{"kv":{"key":"YQ==","value":"MQ==","mod_revision":"4"}}]}})"
      "\n"
      R"({"result":{"header":{"revision":"5"},"events":[{"type":"DELETE","kv":{"key":"YQ==","mod_revision":"5"}}]}})"
      "\n";
  // Every way of cutting the stream in two gives the same three objects.
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    WatchStreamSplitter splitter;
    auto lines = splitter.feed(std::string_view(stream).substr(0, cut));
    auto rest = splitter.feed(std::string_view(stream).substr(cut));
    lines.insert(lines.end(), rest.begin(), rest.end());
    ASSERT_EQ(lines.size(), 3u) << cut;
    EXPECT_EQ(splitter.pending_bytes(), 0u);
  }
  WatchStreamSplitter splitter;
  const auto lines = splitter.feed(stream);
  EXPECT_TRUE(parse_watch_response(lines[0])->created);
  const auto put = *parse_watch_response(lines[1]);
  ASSERT_EQ(put.events.size(), 1u);
  EXPECT_EQ(put.events[0].type, WatchEvent::Type::kPut);
  EXPECT_EQ(put.events[0].kv.value, "1");
  const auto deleted = *parse_watch_response(lines[2]);
  EXPECT_EQ(deleted.events[0].type, WatchEvent::Type::kDelete);
  EXPECT_EQ(deleted.revision, 5);
}

TEST(EtcdWire, AWatchErrorOrCompactionIsSaidInOneLine) {
  EXPECT_EQ(
      parse_watch_response(R"({"error":{"grpc_code":14,"message":"no leader"}})").error().message,
      "the watch failed: no leader");
  EXPECT_EQ(parse_watch_response(R"({"result":{"compact_revision":"9","canceled":true}})")
                ->compact_revision,
            9);
  EXPECT_FALSE(parse_watch_response("{\"result\":"));
}

}  // namespace
}  // namespace mcprun::etcd
