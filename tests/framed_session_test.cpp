#include "common/framed_session.hpp"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/connect_pair.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/write.hpp>
#include <functional>
#include <stdexcept>

#include "common/event_loop.hpp"
#include "common/protocol.hpp"
#include "tests/temp_dir.hpp"

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
  std::chrono::milliseconds renew{0};  ///< Each message asks for the next within this.
  void expect_within(std::chrono::milliseconds limit) { expect_message_within(limit); }

 private:
  void on_frame(const nlohmann::json& message) override {
    ++messages;
    if (renew.count() > 0) expect_message_within(renew);  // As an agent's lease is renewed.
    if (message["type"] == "throw") throw std::runtime_error("handler bug");
    if (!reply_.empty()) send({{"type", "reply"}, {"pad", reply_}});
  }
  void on_closed() override { closed_seen = true; }
  void on_cut(const std::string& reason) override { cut_reason = reason; }
  std::string reply_;

 public:
  std::string cut_reason;
};

struct Pair {
  asio::io_context io;
  local::socket peer{io};
  std::shared_ptr<EchoSession> session;

  explicit Pair(SessionLimits limits, std::string reply = "") {
    local::socket ours(io);
    asio::local::connect_pair(ours, peer);
    session = std::make_shared<EchoSession>(FramedSession::Socket(std::move(ours)), limits,
                                            std::move(reply));
    session->start(std::chrono::milliseconds::zero());
  }
  void send(const std::string& bytes) { asio::write(peer, asio::buffer(bytes)); }
  // Only a failure waits this long: 20,000 frames under ASan beside a full ctest -j took 13 s.
  bool run_until_closed() {
    return run_until(
        io, [&] { return session->closed_seen; }, std::chrono::seconds(60));
  }
};

TEST(FramedSession, AThrowingHandlerClosesOnlyThatConnection) {
  Pair pair(SessionLimits{});
  pair.send(encode_frame({{"type", "ok"}}) + encode_frame({{"type", "throw"}}) +
            encode_frame({{"type", "never handled"}}));
  EXPECT_TRUE(pair.run_until_closed());
  EXPECT_EQ(pair.session->messages, 2);
}

TEST(FramedSession, MessagesKeepADeadlineOpenAndSilenceThenClosesIt) {
  using std::chrono::milliseconds;
  Pair pair(SessionLimits{});
  pair.session->renew = milliseconds(1000);
  pair.session->expect_within(milliseconds(1000));
  // Sixteen messages 100 ms apart: 1.5 s, well past the first deadline, each renewing it. Each
  // has 900 ms to spare, what a process on a loaded box may wait for a CPU (40 ms of 100 did not).
  asio::steady_timer tick(pair.io);
  int sent = 0;
  std::function<void()> next = [&] {
    pair.send(encode_frame({{"type", "heartbeat"}}));
    if (++sent == 16) return;
    tick.expires_after(milliseconds(100));
    tick.async_wait([&](boost::system::error_code ec) {
      if (!ec) next();
    });
  };
  next();
  EXPECT_TRUE(run_until(
      pair.io, [&] { return pair.session->messages == 16 || pair.session->closed_seen; },
      std::chrono::seconds(10)));
  EXPECT_FALSE(pair.session->closed_seen) << pair.session->cut_reason;
  EXPECT_TRUE(pair.run_until_closed());
  EXPECT_EQ(pair.session->cut_reason, "silent for too long");
}

TEST(FramedSession, AShorterLimitTakesEffectAtOnce) {
  Pair pair(SessionLimits{});
  pair.session->expect_within(std::chrono::seconds(60));
  pair.session->expect_within(std::chrono::milliseconds(50));  // The timer armed for 60 s is moved.
  EXPECT_TRUE(pair.run_until_closed());
  EXPECT_EQ(pair.session->cut_reason, "silent for too long");
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

TEST(FramedSession, ACutNamesItsReasonOnce) {
  Pair pair(SessionLimits{.messages_per_second = 10, .message_burst = 1});
  pair.send(encode_frame({{"type", "ok"}}) + encode_frame({{"type", "ok"}}));
  EXPECT_TRUE(pair.run_until_closed());
  EXPECT_EQ(pair.session->cut_reason, "more than 10 messages a second");
}

TEST(FramedSession, UnmeteredPeersAreNotRateCapped) {
  Pair pair(kUnmeteredLimits);
  std::string flood;
  for (int i = 0; i < 20000; ++i) flood += encode_frame({{"type", "ok"}});
  flood += std::string("\0\0\0\5hello", 9);  // A bad frame ends it, after the flood.
  // More than the socket holds: written while the session reads.
  asio::async_write(pair.peer, asio::buffer(flood), [](boost::system::error_code, size_t) {});
  EXPECT_TRUE(pair.run_until_closed());
  EXPECT_EQ(pair.session->messages, 20000);
  EXPECT_EQ(pair.session->cut_reason.rfind("bad frame", 0), 0u) << pair.session->cut_reason;
}

TEST(FramedSession, AnOversizedFrameIsCutBeforeItIsBuffered) {
  Pair pair(kUnmeteredLimits);
  const uint32_t length = kMaxFrameBytes + 1;
  pair.send(std::string{char(length >> 24), char(length >> 16), char(length >> 8), char(length)});
  EXPECT_TRUE(pair.run_until_closed());
  EXPECT_EQ(pair.session->cut_reason.rfind("bad frame", 0), 0u) << pair.session->cut_reason;
}

TEST(FramedSession, WholeUnwrittenFramesOutliveTheConnection) {
  Pair pair(SessionLimits{});
  pair.session->send({{"type", "first"}});  // Being written.
  pair.session->send({{"type", "second"}});
  pair.session->send({{"type", "third"}});
  EXPECT_TRUE(pair.session->writing());
  pair.session->close();
  auto unwritten = pair.session->take_unwritten();
  ASSERT_EQ(unwritten.size(), 2u);
  EXPECT_EQ(unwritten.front(), encode_frame({{"type", "second"}}));
  EXPECT_FALSE(pair.session->writing());
}

TEST(FramedSession, TheQueueCapHoldsOneLargestFrame) {
  Pair pair(SessionLimits{.max_queued_bytes = kMinQueuedBytes});
  std::string largest(kMaxFrameBytes - 64, 'x');
  pair.session->send({{"type", "big"}, {"pad", largest}});
  EXPECT_FALSE(pair.session->closed());
}

/// A unix path in a fresh folder, and the io that dials it.
struct Dial {
  asio::io_context io;
  testing::TempDir dir{"framed-session"};
  std::string path = (dir / "s.sock").string();
};

TEST(ConnectWithin, ReachesAListenerAndSaysFromWhere) {
  Dial dial;
  asio::ip::tcp::acceptor acceptor(dial.io, {asio::ip::make_address("127.0.0.1"), 0});
  auto tcp = connect_within(dial.io, Endpoint{"127.0.0.1", acceptor.local_endpoint().port(), ""},
                            std::chrono::seconds(5));
  ASSERT_TRUE(tcp) << tcp.error().message;
  EXPECT_EQ(tcp->local_address, "127.0.0.1");
  local::acceptor unix_acceptor(dial.io, local::endpoint(dial.path));
  auto unix_socket = connect_within(dial.io, Endpoint{"", 0, dial.path}, std::chrono::seconds(5));
  ASSERT_TRUE(unix_socket) << unix_socket.error().message;
  EXPECT_EQ(unix_socket->local_address, "127.0.0.1");
}

TEST(ConnectWithin, NothingListeningIsRefusedAtOnce) {
  Dial dial;
  int port = 0;
  {
    asio::ip::tcp::acceptor closed(dial.io, {asio::ip::make_address("127.0.0.1"), 0});
    port = closed.local_endpoint().port();
  }
  auto tcp = connect_within(dial.io, Endpoint{"127.0.0.1", port, ""}, std::chrono::seconds(5));
  ASSERT_FALSE(tcp);
  EXPECT_EQ(tcp.error().message, "Connection refused");
  auto unix_socket = connect_within(dial.io, Endpoint{"", 0, dial.path}, std::chrono::seconds(5));
  ASSERT_FALSE(unix_socket);
  EXPECT_EQ(unix_socket.error().message, "No such file or directory");
  auto unresolved =
      connect_within(dial.io, Endpoint{"no-such-host.invalid", 1, ""}, std::chrono::seconds(5));
  ASSERT_FALSE(unresolved);
  EXPECT_EQ(unresolved.error().message.rfind("cannot resolve no-such-host.invalid: ", 0), 0u);
}

/// Whether `run` returned within `limit` and a little more (a loaded box), and no sooner.
template <typename Run>
void expect_given_up_at(std::chrono::milliseconds limit, Run run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, limit);
  EXPECT_LT(took, limit + std::chrono::seconds(2));
}

TEST(ConnectWithin, AListenerThatNeverAcceptsCostsTheDeadline) {
  Dial dial;
  const std::chrono::milliseconds limit(300);
  // Backlog 0: one connection fills each queue; past it the kernel drops SYNs (TCP) or refuses
  // with EAGAIN (unix), and no accept ever frees a slot.
  asio::ip::tcp::acceptor tcp_listener(dial.io, asio::ip::tcp::v4());
  tcp_listener.bind({asio::ip::make_address("127.0.0.1"), 0});
  tcp_listener.listen(0);
  const Endpoint tcp_endpoint{"127.0.0.1", tcp_listener.local_endpoint().port(), ""};
  auto tcp_filler = connect_within(dial.io, tcp_endpoint, std::chrono::seconds(5));
  ASSERT_TRUE(tcp_filler) << tcp_filler.error().message;
  expect_given_up_at(limit, [&] {
    auto tcp = connect_within(dial.io, tcp_endpoint, limit);
    ASSERT_FALSE(tcp);
    EXPECT_EQ(tcp.error().message, "no answer within 0.3 s");
  });

  local::acceptor unix_listener(dial.io, local());
  unix_listener.bind(local::endpoint(dial.path));
  unix_listener.listen(0);
  const Endpoint unix_endpoint{"", 0, dial.path};
  auto unix_filler = connect_within(dial.io, unix_endpoint, std::chrono::seconds(5));
  ASSERT_TRUE(unix_filler) << unix_filler.error().message;
  expect_given_up_at(limit, [&] {
    auto unix_socket = connect_within(dial.io, unix_endpoint, limit);
    ASSERT_FALSE(unix_socket);
    EXPECT_EQ(unix_socket.error().message,
              "no answer within 0.3 s: its backlog is full and it accepts nothing");
  });
}

}  // namespace
}  // namespace mcprun
