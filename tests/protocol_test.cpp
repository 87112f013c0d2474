#include "common/protocol.hpp"

#include <gtest/gtest.h>

namespace mcprun {
namespace {

std::string raw_frame(const std::string& payload) {
  std::string frame(4, '\0');
  const auto n = static_cast<uint32_t>(payload.size());
  frame[0] = static_cast<char>(n >> 24);
  frame[1] = static_cast<char>(n >> 16);
  frame[2] = static_cast<char>(n >> 8);
  frame[3] = static_cast<char>(n);
  return frame + payload;
}

std::string error_of(const std::string& bytes) {
  FrameResult result = decode_frame(bytes);
  EXPECT_TRUE(std::holds_alternative<FrameError>(result)) << bytes;
  auto* error = std::get_if<FrameError>(&result);
  return error ? error->message : "";
}

TEST(Protocol, RoundTripsAndReportsWhatItConsumed) {
  std::string bytes = encode_frame({{"type", "join"}, {"node", "a"}}) + "extra";
  FrameResult result = decode_frame(bytes);
  ASSERT_TRUE(std::holds_alternative<Frame>(result));
  const Frame& frame = std::get<Frame>(result);
  EXPECT_EQ(frame.message["type"], "join");
  EXPECT_EQ(frame.message["v"], kProtocolVersion);
  EXPECT_EQ(frame.consumed, bytes.size() - 5);
}

TEST(Protocol, TruncatedFramesAskForMore) {
  std::string bytes = encode_frame({{"type", "heartbeat"}});
  for (size_t cut : {size_t{0}, size_t{3}, bytes.size() - 1}) {
    FrameResult result = decode_frame(std::string_view(bytes).substr(0, cut));
    ASSERT_TRUE(std::holds_alternative<FrameIncomplete>(result)) << cut;
    EXPECT_GT(std::get<FrameIncomplete>(result).bytes_needed, 0u);
  }
}

TEST(Protocol, OversizedLengthIsRefusedBeforeBuffering) {
  std::string header = "\x7f\xff\xff\xff";
  EXPECT_NE(error_of(header).find("exceeds"), std::string::npos);
}

TEST(Protocol, GarbageWrongTypesAndWrongVersion) {
  EXPECT_NE(error_of(raw_frame("GET / HTTP/1.1")).find("not JSON"), std::string::npos);
  EXPECT_NE(error_of(raw_frame("[1,2]")).find("not a JSON object"), std::string::npos);
  EXPECT_NE(error_of(raw_frame(R"({"type":"join"})")).find("version"), std::string::npos);
  EXPECT_NE(error_of(raw_frame(R"({"v":"1","type":"join"})")).find("version"), std::string::npos);
  EXPECT_NE(error_of(raw_frame(R"({"v":99,"type":"join"})")).find("99"), std::string::npos);
  EXPECT_NE(error_of(raw_frame(R"({"v":1,"type":7})")).find("type"), std::string::npos);
}

TEST(Protocol, TokensCompareExactly) {
  EXPECT_TRUE(tokens_equal("s3cret", "s3cret"));
  EXPECT_FALSE(tokens_equal("s3cre", "s3cret"));
  EXPECT_FALSE(tokens_equal("s3cret!", "s3cret"));
  EXPECT_FALSE(tokens_equal("S3cret", "s3cret"));
  EXPECT_FALSE(tokens_equal("", "s3cret"));
  EXPECT_TRUE(tokens_equal("", ""));
}

}  // namespace
}  // namespace mcprun
