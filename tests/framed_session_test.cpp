#include "common/framed_session.hpp"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/connect_pair.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/write.hpp>

#include <stdexcept>

#include "common/event_loop.hpp"
#include "common/protocol.hpp"

namespace mcprun {
namespace {

namespace asio = boost::asio;
using local = asio::local::stream_protocol;

/// Answers each message with `reply`, or throws when told to; counts what it saw.
class EchoSession : public FramedSession {
 public:
  EchoSession(Socket socket, SessionLimits limits, std::string reply)
      : FramedSession(std::move(socket), "test peer", limits), reply_(std::move(reply)) {}
  int messages = 0;
  bool closed_seen = false;

 private:
  void on_frame(const nlohmann::json& message) override {
    ++messages;
    if (message["type"] == "throw") throw std::runtime_error("handler bug");
    if (!reply_.empty()) send({{"type", "reply"}, {"pad", reply_}});
  }
  void on_closed() override { closed_seen = true; }
  std::string reply_;
};

struct Pair {
  asio::io_context io;
  local::socket peer{io};
  std::shared_ptr<EchoSession> session;

  explicit Pair(SessionLimits limits, std::string reply = "") {
    local::socket ours(io);
    asio::local::connect_pair(ours, peer);
    session = std::make_shared<EchoSession>(FramedSession::Socket(std::move(ours)), limits, std::move(reply));
    session->start(std::chrono::milliseconds::zero());
  }
  void send(const std::string& bytes) { asio::write(peer, asio::buffer(bytes)); }
  bool run_until_closed() {
    return run_until(io, [&] { return session->closed_seen; }, std::chrono::seconds(5));
  }
};

TEST(FramedSession, AThrowingHandlerClosesOnlyThatConnection) {
  Pair pair(SessionLimits{});
  pair.send(encode_frame({{"type", "ok"}}) + encode_frame({{"type", "throw"}}) +
            encode_frame({{"type", "never handled"}}));
  EXPECT_TRUE(pair.run_until_closed());
  EXPECT_EQ(pair.session->messages, 2);
}

TEST(FramedSession, AFloodPastTheMessageRateIsClosed) {
  Pair pair(SessionLimits{.messages_per_second = 10, .message_burst = 20});
  std::string flood;
  for (int i = 0; i < 100; ++i) flood += encode_frame({{"type", "ok"}});
  pair.send(flood);
  EXPECT_TRUE(pair.run_until_closed());
  EXPECT_EQ(pair.session->messages, 20);
}

TEST(FramedSession, APeerThatNeverReadsIsClosedAtTheQueueLimit) {
  Pair pair(SessionLimits{.max_queued_bytes = 256 * 1024}, std::string(16 * 1024, 'x'));
  std::string requests;
  for (int i = 0; i < 200; ++i) requests += encode_frame({{"type", "ok"}});
  pair.send(requests);  // 200 answers of 16 KiB: far past what the socket buffers and the limit.
  EXPECT_TRUE(pair.run_until_closed());
  EXPECT_LT(pair.session->messages, 200);
}

TEST(FramedSession, ABadFrameClosesTheConnection) {
  Pair pair(SessionLimits{});
  pair.send(std::string("\0\0\0\5hello", 9));
  EXPECT_TRUE(pair.run_until_closed());
  EXPECT_EQ(pair.session->messages, 0);
}

}  // namespace
}  // namespace mcprun
