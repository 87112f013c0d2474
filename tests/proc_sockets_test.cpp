#include "common/proc_sockets.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace mcprun {
namespace {

using boost::asio::ip::make_address;
using boost::asio::ip::tcp;

TEST(ProcSockets, FindsThisProcessesConnectionToAPort) {
  boost::asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(make_address("127.0.0.1"), 0));
  tcp::socket client(io);
  client.connect(acceptor.local_endpoint());
  tcp::socket served = acceptor.accept();
  const auto ends = connections_to_port(::getpid(), acceptor.local_endpoint().port());
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_EQ(ends[0].address, "127.0.0.1");
  EXPECT_EQ(ends[0].port, client.local_endpoint().port());
  EXPECT_TRUE(connections_to_port(::getpid(), 1).empty());
}

TEST(ProcSockets, AConnectionWhosePeerDoesNotReadHoldsItsBytesInTheSendQueue) {
  boost::asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(make_address("127.0.0.1"), 0));
  tcp::socket client(io);
  client.connect(acceptor.local_endpoint());
  tcp::socket served = acceptor.accept();  // ...and never read: the peer's buffers fill.
  client.non_blocking(true);
  const std::vector<char> chunk(1 << 16, 'x');
  boost::system::error_code ec;
  for (int i = 0; i < 4096 && !ec; ++i) client.write_some(boost::asio::buffer(chunk), ec);
  ASSERT_EQ(ec, boost::asio::error::would_block);
  uint64_t queued = 0;
  for (const QueuedConnection& connection : send_queues(::getpid()))
    if (connection.remote.port == acceptor.local_endpoint().port()) queued = connection.send_queue;
  EXPECT_GT(queued, 0u);
}

TEST(ProcSockets, FindsWhoListensOnAPortAndNothingOnABoundOne) {
  boost::asio::io_context io;
  tcp::acceptor listening(io, tcp::endpoint(make_address("127.0.0.1"), 0));
  auto listener = listener_on_port(listening.local_endpoint().port());
  ASSERT_TRUE(listener);
  ASSERT_TRUE(listener->pid);
  EXPECT_EQ(*listener->pid, ::getpid());
  EXPECT_FALSE(listener->command.empty());

  tcp::acceptor bound(io);  // Bound, never listening: what a PortReservation holds.
  bound.open(tcp::v4());
  bound.bind(tcp::endpoint(make_address("127.0.0.1"), 0));
  EXPECT_FALSE(listener_on_port(bound.local_endpoint().port()));
}

}  // namespace
}  // namespace mcprun
