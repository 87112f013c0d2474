#include "launcher/store/tcp_store.hpp"

#include <gtest/gtest.h>
#include <poll.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>

namespace mcprun {
namespace {

using namespace std::string_literals;

using Kind = StoreEvent::Kind;

/// Query numbers as each torch sends them: the whole table, though not every test uses each.
namespace torch1 {
[[maybe_unused]] constexpr uint8_t kSet = 0, kCompareSet = 1, kGet = 2, kAdd = 3, kCheck = 4,
                                   kWait = 5, kNumKeys = 6, kWatchKey = 7, kDeleteKey = 8;
}
namespace torch2 {
[[maybe_unused]] constexpr uint8_t kValidate = 0, kSet = 1, kCompareSet = 2, kGet = 3, kAdd = 4,
                                   kCheck = 5, kWait = 6, kNumKeys = 7, kDeleteKey = 8, kAppend = 9,
                                   kMultiGet = 10, kMultiSet = 11, kCancelWait = 12, kPing = 13,
                                   kQueuePush = 14, kQueuePop = 15, kQueueLen = 16, kListKeys = 17,
                                   kBarrier = 18;
}

/// Little-endian fields, as torch's SendBuffer writes them.
template <class T>
std::string raw(T value) {
  std::string bytes(sizeof(T), '\0');
  std::memcpy(bytes.data(), &value, sizeof(T));
  return bytes;
}
std::string str(std::string_view text) { return raw<uint64_t>(text.size()) + std::string(text); }
std::string query(uint8_t code) { return std::string(1, static_cast<char>(code)); }
std::string from_hex(std::string_view hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    bytes.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  return bytes;
}
const std::string kHandshake = query(torch2::kValidate) + raw<uint32_t>(kStoreValidationMagic);

/// Keeps what StoreState sends out of band and the changes it reports.
class RecordingOutlet : public StoreOutlet {
 public:
  struct Change {
    Kind kind;
    uint64_t connection;
    std::string key;
    int64_t value;
    bool operator==(const Change&) const = default;
  };
  void deliver(uint64_t connection, std::string_view bytes) override {
    delivered[connection] += bytes;
  }
  void changed(Kind kind, uint64_t connection, std::string_view key, int64_t value) override {
    changes.push_back({kind, connection, std::string(key), value});
  }
  std::map<uint64_t, std::string> delivered;
  std::vector<Change> changes;
};

class TcpStoreProtocolTest : public ::testing::Test {
 protected:
  /// Everything at once: it must all be consumed.
  std::string send(StoreProtocol& client, const std::string& bytes) {
    std::string replies;
    EXPECT_EQ(client.consume(bytes, replies), bytes.size());
    EXPECT_FALSE(client.failed()) << client.error();
    return replies;
  }
  /// As a session does with a socket that delivers `chunk` bytes per read.
  std::string send_in_pieces(StoreProtocol& client, const std::string& bytes, size_t chunk) {
    std::string buffer, replies;
    for (size_t at = 0; at < bytes.size(); at += chunk) {
      buffer += bytes.substr(at, chunk);
      buffer.erase(0, client.consume(buffer, replies));
      EXPECT_FALSE(client.failed()) << client.error();
    }
    EXPECT_EQ(buffer, "");
    return replies;
  }
  std::string failure(StoreProtocol& client, const std::string& bytes) {
    std::string replies;
    client.consume(bytes, replies);
    EXPECT_TRUE(client.failed());
    return client.error();
  }

  RecordingOutlet outlet;
  StoreState state{outlet};
  StoreProtocol one{state, 1}, two{state, 2};
};

TEST_F(TcpStoreProtocolTest, AnswersTorch113ClientBytesAsTorch113sServerDid) {
  // Captured from torch 1.13's client and server: set("k", "v") (keys carry the "/" prefix),
  // get("k") as WAIT then GET, add("n", 5), add("n", -7), num_keys(), delete_key("k") twice.
  EXPECT_EQ(send(one, from_hex("0002000000000000002f6b010000000000000076")), "");
  EXPECT_EQ(send(one, from_hex("05010000000000000002000000000000002f6b")), from_hex("00"));
  EXPECT_EQ(send(one, from_hex("0202000000000000002f6b")), from_hex("010000000000000076"));
  EXPECT_EQ(send(one, from_hex("0302000000000000002f6e0500000000000000")), raw<int64_t>(5));
  EXPECT_EQ(send(one, from_hex("0302000000000000002f6ef9ffffffffffffff")), raw<int64_t>(-2));
  EXPECT_EQ(send(one, from_hex("06")), raw<int64_t>(2));
  EXPECT_EQ(send(one, from_hex("0802000000000000002f6b")), raw<int64_t>(1));
  EXPECT_EQ(send(one, from_hex("0802000000000000002f6b")), raw<int64_t>(0));
  EXPECT_EQ(one.dialect(), StoreDialect::kTorch1);
  EXPECT_EQ(*state.get("/n"), "-2");  // Counters are decimal strings.
}

TEST_F(TcpStoreProtocolTest, CompareSetFollowsTorch) {
  auto cas = [&](std::string key, std::string expected, std::string desired) {
    return send(one, query(torch1::kCompareSet) + str(key) + str(expected) + str(desired));
  };
  EXPECT_EQ(cas("m", "", "x"), str("x"));    // Missing key, empty expected: created.
  EXPECT_EQ(cas("m2", "e", "y"), str("e"));  // Missing key, other expected: torch answers it back.
  EXPECT_EQ(state.get("m2"), nullptr);
  EXPECT_EQ(cas("m", "x", "z"), str("z"));    // Match.
  EXPECT_EQ(cas("m", "bad", "q"), str("z"));  // Mismatch: the current value.
  EXPECT_EQ(outlet.changes, (std::vector<RecordingOutlet::Change>{{Kind::kSet, 1, "m", 0},
                                                                  {Kind::kSet, 1, "m", 0}}));
}

TEST_F(TcpStoreProtocolTest, PipelinedAndSplitRequestsGetTheSameReplies) {
  const std::string torch1_script =
      query(torch1::kSet) + str("a") + str(std::string(3000, 'x')) + query(torch1::kAdd) +
      str("n") + raw<int64_t>(7) + query(torch1::kWait) + raw<uint64_t>(2) + str("a") + str("n") +
      query(torch1::kGet) + str("a") + query(torch1::kCheck) + raw<uint64_t>(1) + str("zz") +
      query(torch1::kNumKeys) + query(torch1::kCompareSet) + str("n") + str("7") + str("") +
      query(torch1::kDeleteKey) + str("a");
  const std::string expected = raw<int64_t>(7) + std::string(1, '\0') +
                               str(std::string(3000, 'x')) + std::string(1, '\1') +
                               raw<int64_t>(2) + str("") + raw<int64_t>(1);
  for (size_t chunk : {size_t{1}, size_t{2}, size_t{7}, size_t{4096}}) {
    RecordingOutlet fresh_outlet;
    StoreState fresh{fresh_outlet};
    StoreProtocol client(fresh, 1);
    EXPECT_EQ(send_in_pieces(client, torch1_script, chunk), expected) << chunk;
  }
  const std::string torch2_script =
      kHandshake + query(torch2::kPing) + raw<uint32_t>(4242) + query(torch2::kSet) + str("a") +
      str("v") + query(torch2::kGet) + str("a") + query(torch2::kGet) + str("missing") +
      query(torch2::kListKeys) + query(torch2::kMultiSet) + raw<int64_t>(2) + str("p") + str("1") +
      str("q") + str("") + query(torch2::kMultiGet) + raw<uint64_t>(2) + str("q") + str("p");
  for (size_t chunk : {size_t{1}, size_t{3}, size_t{5}, size_t{100}}) {
    RecordingOutlet fresh_outlet;
    StoreState fresh{fresh_outlet};
    StoreProtocol client(fresh, 1);
    EXPECT_EQ(
        send_in_pieces(client, torch2_script, chunk),
        raw<uint32_t>(4242) + str("v") + str("") + raw<int64_t>(1) + str("a") + str("") + str("1"))
        << chunk;
    EXPECT_EQ(client.dialect(), StoreDialect::kTorch2);
  }
}

TEST_F(TcpStoreProtocolTest, DialectWaitsForTheFifthByteOnlyWhenItMustDecide) {
  std::string replies;
  EXPECT_EQ(one.consume(kHandshake.substr(0, 4), replies), 0u);
  EXPECT_EQ(one.dialect(), StoreDialect::kUndecided);
  EXPECT_EQ(two.consume(query(torch1::kNumKeys), replies), 1u);  // Not 0: torch 1.x at once.
  EXPECT_EQ(two.dialect(), StoreDialect::kTorch1);
  EXPECT_EQ(replies, raw<int64_t>(0));
}

TEST_F(TcpStoreProtocolTest, WaitIsAnsweredWhenTheLastKeyArrives) {
  EXPECT_EQ(send(one, query(torch1::kWait) + raw<uint64_t>(3) + str("a") + str("b") + str("a")),
            "");
  EXPECT_EQ(state.waiter_count(), 1u);
  send(two, query(torch1::kSet) + str("a") + str("1"));
  EXPECT_EQ(outlet.delivered[1], "");
  send(two, query(torch1::kAdd) + str("b") + raw<int64_t>(1));
  EXPECT_EQ(outlet.delivered[1], std::string(1, '\0'));  // STOP_WAITING, once.
  EXPECT_EQ(state.waiter_count(), 0u);
  send(two, query(torch1::kSet) + str("b") + str("2"));
  EXPECT_EQ(outlet.delivered[1], std::string(1, '\0'));
}

TEST_F(TcpStoreProtocolTest, KeysMadeByCompareSetOrAppendWakeWaiters) {
  send(one, query(torch1::kWait) + raw<uint64_t>(1) + str("c"));
  send(two, query(torch1::kCompareSet) + str("c") + str("") + str("v"));
  EXPECT_EQ(outlet.delivered[1], std::string(1, '\0'));
  send(one, query(torch1::kWait) + raw<uint64_t>(1) + str("d"));
  StoreProtocol torch2_client(state, 3);
  send(torch2_client, kHandshake + query(torch2::kAppend) + str("d") + str("x"));
  EXPECT_EQ(outlet.delivered[1], std::string(2, '\0'));
}

TEST_F(TcpStoreProtocolTest, AClosedConnectionLeavesNoWaiterBehind) {
  send(one, query(torch1::kWait) + raw<uint64_t>(1) + str("k"));
  state.drop_connection(1);
  EXPECT_EQ(state.waiter_count(), 0u);
  send(two, query(torch1::kSet) + str("k") + str("v"));
  EXPECT_EQ(outlet.delivered.count(1), 0u);
}

TEST_F(TcpStoreProtocolTest, CancelWaitAnswersWaitCanceledAndForgetsTheWait) {
  send(one, kHandshake + query(torch2::kWait) + raw<uint64_t>(1) + str("k"));
  EXPECT_EQ(send(one, query(torch2::kCancelWait)), std::string(1, '\1'));
  EXPECT_EQ(state.waiter_count(), 0u);
  send(two, kHandshake + query(torch2::kSet) + str("k") + str("v"));
  EXPECT_EQ(outlet.delivered.count(1), 0u);
}

TEST_F(TcpStoreProtocolTest, WatchKeySendsTorch1NoticesOnEveryChange) {
  EXPECT_EQ(send(one, query(torch1::kWatchKey) + str("w")), std::string(1, '\3'));
  send(two, query(torch1::kSet) + str("w") + str("a"));
  // "a" is no counter: torch closes such a connection too, and nothing changes.
  EXPECT_NE(failure(two, query(torch1::kAdd) + str("w") + raw<int64_t>(0)).find("not a number"),
            std::string::npos);
  StoreProtocol three(state, 3);  // A torch 2.x client, changing the same keys.
  send(three, kHandshake + query(torch2::kSet) + str("w") + str("b"));
  send(three, query(torch2::kAppend) + str("w") + str("c"));
  send(three, query(torch2::kDeleteKey) + str("w"));
  EXPECT_EQ(outlet.delivered[1], "\1" + str("w") + str("") + str("a") +        // KEY_CREATED
                                     "\0"s + str("w") + str("a") + str("b") +  // KEY_UPDATED
                                     "\4" + str("w") + str("") + str("c") +    // KEY_APPENDED
                                     "\2" + str("w") + str("bc") + str(""));   // KEY_DELETED
  const std::string before_close = outlet.delivered[1];
  state.drop_connection(1);
  send(three, query(torch2::kSet) + str("w") + str("again"));
  EXPECT_EQ(outlet.delivered[1], before_close);
}

TEST_F(TcpStoreProtocolTest, CountersParseLikeStollAndWrapOnOverflow) {
  state.set(0, "c", "  12abc");
  EXPECT_EQ(send(one, query(torch1::kAdd) + str("c") + raw<int64_t>(1)), raw<int64_t>(13));
  state.set(0, "max", std::to_string(INT64_MAX));
  EXPECT_EQ(send(one, query(torch1::kAdd) + str("max") + raw<int64_t>(1)), raw<int64_t>(INT64_MIN));
  EXPECT_EQ(send(one, query(torch1::kAdd) + str("zero") + raw<int64_t>(0)), raw<int64_t>(0));
  EXPECT_EQ(*state.get("zero"), "0");
  EXPECT_EQ(outlet.changes.back(), (RecordingOutlet::Change{Kind::kAdd, 1, "zero", 0}));
}

TEST_F(TcpStoreProtocolTest, BadInputEndsOnlyThatConnection) {
  EXPECT_NE(failure(one, query(torch1::kSet) + raw<uint64_t>(uint64_t{1} << 60)).find("exceeds"),
            std::string::npos);
  EXPECT_NE(failure(two, query(torch1::kWait) + raw<uint64_t>(uint64_t{1} << 60)).find("count"),
            std::string::npos);
  StoreProtocol three(state, 3), four(state, 4), five(state, 5);
  EXPECT_NE(failure(three, query(99)).find("unknown query type 99"), std::string::npos);
  EXPECT_NE(failure(four, kHandshake + kHandshake).find("unknown query type 0"), std::string::npos);
  EXPECT_NE(failure(five, query(torch1::kGet) + str("nothing")).find("missing key"),
            std::string::npos);
}

TEST_F(TcpStoreProtocolTest, ATruncatedRequestIsNotAnError) {
  std::string replies;
  const std::string set = query(torch1::kSet) + str("key") + str(std::string(1 << 20, 'v'));
  EXPECT_EQ(one.consume(std::string_view(set).substr(0, set.size() - 1), replies), 0u);
  EXPECT_FALSE(one.failed());
  EXPECT_EQ(state.get("key"), nullptr);  // Nothing happens before the request is whole.
  EXPECT_EQ(one.consume(set, replies), set.size());
  EXPECT_EQ(state.get("key")->size(), size_t{1} << 20);
}

TEST_F(TcpStoreProtocolTest, QueuesPopInOrderAndWakeOneBlockedPopper) {
  StoreProtocol three(state, 3);
  send(one, kHandshake);
  send(two, kHandshake + query(torch2::kWait) + raw<uint64_t>(1) + str("q"));
  send(three, kHandshake + query(torch2::kWait) + raw<uint64_t>(1) + str("q"));
  send(one, query(torch2::kQueuePush) + str("q") + str("first"));
  EXPECT_EQ(outlet.delivered[2], std::string(1, '\0'));
  EXPECT_EQ(outlet.delivered.count(3), 0u);  // One push, one woken popper.
  send(one, query(torch2::kQueuePush) + str("q") + str("second"));
  EXPECT_EQ(outlet.delivered[3], std::string(1, '\0'));
  EXPECT_EQ(send(one, query(torch2::kQueueLen) + str("q")), raw<int64_t>(2));
  EXPECT_EQ(send(two, query(torch2::kQueuePop) + str("q")), raw<int64_t>(2) + str("first"));
  EXPECT_EQ(send(two, query(torch2::kQueuePop) + str("q")), raw<int64_t>(1) + str("second"));
  EXPECT_EQ(send(two, query(torch2::kQueuePop) + str("q")), raw<int64_t>(0));
  EXPECT_EQ(send(two, query(torch2::kCheck) + raw<uint64_t>(1) + str("q")), std::string(1, '\1'));
}

TEST_F(TcpStoreProtocolTest, BarrierReleasesEveryoneWithTheLastArrival) {
  StoreProtocol three(state, 3);
  const std::string arrive = query(torch2::kBarrier) + str("b") + raw<int64_t>(3);
  EXPECT_EQ(send(one, kHandshake + arrive), "");
  EXPECT_EQ(send(two, kHandshake + arrive), "");
  EXPECT_EQ(outlet.delivered.size(), 0u);
  EXPECT_EQ(send(three, kHandshake + arrive), std::string(1, '\0'));
  EXPECT_EQ(outlet.delivered[1], std::string(1, '\0'));
  EXPECT_EQ(outlet.delivered[2], std::string(1, '\0'));
  EXPECT_EQ(*state.get("b"), "3");
}

TEST_F(TcpStoreProtocolTest, ChangesAreReportedPerKey) {
  send(one, kHandshake + query(torch2::kMultiSet) + raw<int64_t>(2) + str("x") + str("1") +
                str("y") + str("2") + query(torch2::kAppend) + str("x") + str("3") +
                query(torch2::kDeleteKey) + str("y") + query(torch2::kDeleteKey) + str("y"));
  EXPECT_EQ(outlet.changes, (std::vector<RecordingOutlet::Change>{{Kind::kSet, 1, "x", 0},
                                                                  {Kind::kSet, 1, "y", 0},
                                                                  {Kind::kSet, 1, "x", 0},
                                                                  {Kind::kDeleted, 1, "y", 0}}));
  EXPECT_EQ(*state.get("x"), "13");
}

// --- the server, over loopback ------------------------------------------------------------------

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

class TcpStoreServerTest : public ::testing::Test {
 protected:
  tcp::acceptor bound_acceptor() {
    tcp::acceptor acceptor(io, tcp::v4());
    acceptor.set_option(asio::socket_base::reuse_address(true));
    acceptor.bind({asio::ip::address_v4::loopback(), 0});
    return acceptor;
  }
  /// A blocking client on its own context, as torch's is.
  tcp::socket connect(unsigned short port) {
    tcp::socket socket(client_io);
    socket.connect({asio::ip::address_v4::loopback(), port});
    return socket;
  }
  /// Runs the server until `done()`, for at most a few seconds.
  bool serve_until(const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      io.run_for(std::chrono::milliseconds(5));
    }
    return true;
  }
  /// Serves until `n` bytes have come back on `socket`.
  std::string receive(tcp::socket& socket, size_t n) {
    std::string bytes;
    socket.non_blocking(true);
    EXPECT_TRUE(serve_until([&] {
      char chunk[4096];
      boost::system::error_code ec;
      const size_t got =
          socket.read_some(asio::buffer(chunk, std::min(sizeof chunk, n - bytes.size())), ec);
      bytes.append(chunk, ec ? 0 : got);
      return bytes.size() >= n;
    }));
    return bytes;
  }

  asio::io_context io, client_io;
};

TEST_F(TcpStoreServerTest, ServesClientsAndReportsWhatTheyDo) {
  std::vector<StoreEvent> events;
  TcpStoreServer server(io, bound_acceptor(), [&](const StoreEvent& e) { events.push_back(e); });
  tcp::socket waiter = connect(server.port()), setter = connect(server.port());
  asio::write(waiter,
              asio::buffer(kHandshake + query(torch2::kWait) + raw<uint64_t>(1) + str("k")));
  EXPECT_TRUE(serve_until([&] { return server.connection_count() == 2; }));
  asio::write(setter, asio::buffer(query(torch1::kSet) + str("k") + str("v") + query(torch1::kAdd) +
                                   str("n") + raw<int64_t>(4)));
  EXPECT_EQ(receive(setter, 8), raw<int64_t>(4));
  EXPECT_EQ(receive(waiter, 1), std::string(1, '\0'));
  const tcp::endpoint setter_address = setter.local_endpoint();
  setter.close();
  EXPECT_TRUE(serve_until([&] { return server.connection_count() == 1; }));

  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].kind, Kind::kConnected);
  EXPECT_EQ(events[2].kind, Kind::kSet);
  EXPECT_EQ(events[2].key, "k");
  EXPECT_EQ(events[2].peer, setter_address);
  EXPECT_EQ(events[3].kind, Kind::kAdd);
  EXPECT_EQ(events[3].value, 4);
  EXPECT_EQ(events[4].kind, Kind::kDisconnected);
  EXPECT_EQ(events[4].connection, events[2].connection);
}

TEST_F(TcpStoreServerTest, GarbageClosesOnlyThatConnection) {
  TcpStoreServer server(io, bound_acceptor());
  tcp::socket bad = connect(server.port()), good = connect(server.port());
  EXPECT_TRUE(serve_until([&] { return server.connection_count() == 2; }));
  asio::write(bad, asio::buffer(query(torch1::kSet) + raw<uint64_t>(uint64_t{1} << 60)));
  EXPECT_TRUE(serve_until([&] { return server.connection_count() == 1; }));
  asio::write(good, asio::buffer(query(torch1::kNumKeys)));
  EXPECT_EQ(receive(good, 8), raw<int64_t>(0));
}

TEST_F(TcpStoreServerTest, DestroyingTheServerWithWorkInFlightIsSafe) {
  auto server = std::make_unique<TcpStoreServer>(io, bound_acceptor());
  const unsigned short port = server->port();
  tcp::socket waiting = connect(port), late = connect(port);
  asio::write(waiting, asio::buffer(query(torch1::kWait) + raw<uint64_t>(1) + str("never")));
  EXPECT_TRUE(serve_until([&] { return server->connection_count() == 2; }));
  server.reset();  // Reads, an accept and a wait are still pending.
  io.run_for(std::chrono::milliseconds(50));
  // A deadline on the read: a server that left the connection open fails here instead of hanging.
  pollfd readable{waiting.native_handle(), POLLIN, 0};
  ASSERT_EQ(::poll(&readable, 1, 5000), 1)
      << "the destroyed server's connection is still open after 5 s";
  char byte;
  boost::system::error_code ec;
  asio::read(waiting, asio::buffer(&byte, 1), ec);
  EXPECT_EQ(ec, asio::error::eof);
}

TEST_F(TcpStoreServerTest, ResetIsANewStoreOnTheSamePort) {
  TcpStoreServer server(io, bound_acceptor());
  const unsigned short port = server.port();
  tcp::socket old_attempt = connect(port);
  asio::write(old_attempt,
              asio::buffer(query(torch1::kSet) + str("/default_pg/0//cpu//0/1") + str("stale") +
                           query(torch1::kAdd) + str("barrier") + raw<int64_t>(3)));
  EXPECT_EQ(receive(old_attempt, 8), raw<int64_t>(3));
  server.reset();
  old_attempt.non_blocking(true);
  EXPECT_TRUE(serve_until([&] {
    char byte;
    boost::system::error_code ec;
    old_attempt.read_some(asio::buffer(&byte, 1), ec);
    return ec == asio::error::eof;
  })) << "the last attempt's connections are closed";

  tcp::socket next_attempt = connect(port);
  asio::write(next_attempt, asio::buffer(query(torch1::kNumKeys) + query(torch1::kAdd) +
                                         str("barrier") + raw<int64_t>(1)));
  EXPECT_EQ(receive(next_attempt, 16), raw<int64_t>(0) + raw<int64_t>(1))
      << "no key or counter of the last attempt is left";
}

TEST_F(TcpStoreServerTest, EraseKeepsConnectionsAndKeysOutsideThePrefix) {
  TcpStoreServer server(io, bound_acceptor());
  tcp::socket client = connect(server.port());
  asio::write(client,
              asio::buffer(query(torch1::kSet) + str("mcprun/preflight/0/info/0") + str("a") +
                           query(torch1::kSet) + str("mcprun/preflight/1/info/0") + str("b") +
                           query(torch1::kSet) + str("/default_pg/0") + str("c") +
                           query(torch1::kNumKeys)));
  EXPECT_EQ(receive(client, 8), raw<int64_t>(3));
  server.erase_prefix("mcprun/preflight/0/");
  EXPECT_EQ(server.value("mcprun/preflight/0/info/0"), nullptr);
  ASSERT_NE(server.value("mcprun/preflight/1/info/0"), nullptr);
  ASSERT_NE(server.value("/default_pg/0"), nullptr);
  asio::write(client, asio::buffer(query(torch1::kNumKeys)));
  EXPECT_EQ(receive(client, 8), raw<int64_t>(2)) << "the same connection still answers";
}

TEST_F(TcpStoreServerTest, TakesAnAcceptorThatIsAlreadyListening) {
  tcp::acceptor acceptor = bound_acceptor();
  acceptor.listen();
  TcpStoreServer server(io, std::move(acceptor));
  tcp::socket client = connect(server.port());
  asio::write(client, asio::buffer(kHandshake + query(torch2::kPing) + raw<uint32_t>(7)));
  EXPECT_EQ(receive(client, 4), raw<uint32_t>(7));
}

}  // namespace
}  // namespace mcprun
