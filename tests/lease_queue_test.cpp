// The GPU lease queue: who gets GPUs in which order, what a waiting job is told, and what happens
// to the requests of agents that went away.
#include "rendezvous/lease_queue.hpp"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <memory>

namespace mcprun {
namespace {

const auto kAnyPortFree = [](int) { return true; };

/// Stands in for an agent's session: the queue only holds it weakly and hands it back.
using Waiter = std::shared_ptr<int>;
Waiter waiter() { return std::make_shared<int>(0); }

LeaseQueue box_of(std::vector<std::string> gpus) {
  return LeaseQueue(LeaseBook(std::move(gpus), 29500, 29509), kAnyPortFree);
}

TEST(LeaseQueue, GrantsEveryRequestThatFitsAndHandsBackItsWaiter) {
  LeaseQueue queue = box_of({"a", "b", "c"});
  Waiter alice = waiter(), bob = waiter();
  queue.enqueue(alice, 2, "alice, job x");
  queue.enqueue(bob, 1, "bob, job y");
  auto grants = queue.grant_waiting();
  ASSERT_EQ(grants.size(), 2u);
  EXPECT_EQ(grants[0].waiter, alice);
  EXPECT_EQ(grants[0].lease.gpus, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(grants[1].waiter, bob);
  EXPECT_EQ(grants[1].lease.gpus, std::vector<std::string>{"c"});
  EXPECT_NE(grants[0].id, grants[1].id);
  EXPECT_NE(grants[0].lease.port, grants[1].lease.port);
  EXPECT_EQ(queue.waiting_count(), 0u);
  EXPECT_EQ(queue.leased_gpus(), 3u);
}

TEST(LeaseQueue, AnOlderGpuRequestBlocksYoungerOnesButNotPortOnlyOnes) {
  LeaseQueue queue = box_of({"a", "b"});
  Waiter holder = waiter(), big = waiter(), small = waiter(), cpu_only = waiter();
  queue.enqueue(holder, 1, "alice, job x");
  ASSERT_EQ(queue.grant_waiting().size(), 1u);
  queue.enqueue(big, 2, "bob, job y");
  queue.enqueue(small, 1, "carol, job z");
  queue.enqueue(cpu_only, 0, "dave, job w");
  auto grants = queue.grant_waiting();
  // One GPU is free, but bob asked first for two: carol waits behind him; dave needs no GPU.
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_EQ(grants[0].waiter, cpu_only);
  EXPECT_EQ(queue.waiting_count(), 2u);
  EXPECT_EQ(queue.position(small.get(), 1),
            "1 GPU(s) wanted, 1 of 2 free; held by alice, job x (a, port 29500); dave, job w (port "
            "29501); waiting first: bob, job y (2 GPU(s))");
}

TEST(LeaseQueue, AReleaseHandsTheGpusToTheOldestWaiter) {
  LeaseQueue queue = box_of({"a", "b"});
  Waiter holder = waiter(), big = waiter(), small = waiter();
  queue.enqueue(holder, 1, "alice, job x");
  const uint64_t held = queue.grant_waiting().at(0).id;
  queue.enqueue(big, 2, "bob, job y");
  queue.enqueue(small, 1, "carol, job z");
  EXPECT_TRUE(queue.grant_waiting().empty());
  queue.release(held);
  auto grants = queue.grant_waiting();
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_EQ(grants[0].waiter, big);
  EXPECT_EQ(queue.position(small.get(), 1),
            "1 GPU(s) wanted, 0 of 2 free; held by bob, job y (a,b, port 29500)");
}

TEST(LeaseQueue, AWithdrawnRequestNoLongerBlocksTheOnesBehindIt) {
  LeaseQueue queue = box_of({"a"});
  Waiter greedy = waiter(), modest = waiter();
  queue.enqueue(greedy, 2, "bob, job y");  // More than the box has free: it would wait forever.
  queue.enqueue(modest, 1, "carol, job z");
  EXPECT_TRUE(queue.grant_waiting().empty());
  EXPECT_TRUE(queue.withdraw(greedy.get()));
  EXPECT_FALSE(queue.withdraw(greedy.get()));
  auto grants = queue.grant_waiting();
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_EQ(grants[0].waiter, modest);
}

TEST(LeaseQueue, ARequestWhoseAgentIsGoneIsDroppedUnanswered) {
  LeaseQueue queue = box_of({"a"});
  Waiter gone = waiter(), next = waiter();
  queue.enqueue(gone, 1, "bob, job y");
  queue.enqueue(next, 1, "carol, job z");
  gone.reset();
  auto grants = queue.grant_waiting();
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_EQ(grants[0].waiter, next);
  EXPECT_EQ(queue.waiting_count(), 0u);
}

TEST(LeaseQueue, WithdrawingARequestCancelsItsDeadline) {
  boost::asio::io_context io;
  LeaseQueue queue = box_of({});
  Waiter bob = waiter();
  auto deadline = std::make_unique<boost::asio::steady_timer>(io, std::chrono::hours(1));
  std::optional<boost::system::error_code> ended;
  deadline->async_wait([&](boost::system::error_code ec) { ended = ec; });
  queue.enqueue(bob, 1, "bob, job y", std::move(deadline));
  queue.withdraw(bob.get());
  io.run();  // Returns at once: the only work, the timer, is gone.
  ASSERT_TRUE(ended);
  EXPECT_EQ(*ended, boost::asio::error::operation_aborted);
}

TEST(LeaseQueue, RestoreRegrantsWhatAJobHeldUnlessAnotherTookIt) {
  LeaseQueue queue = box_of({"a", "b"});
  auto restored = queue.restore({{"b"}, 29503, "alice, job x"});
  ASSERT_TRUE(restored);
  EXPECT_FALSE(queue.restore({{"b"}, 29504, "bob, job y"}));
  Waiter carol = waiter();
  queue.enqueue(carol, 1, "carol, job z");
  auto grants = queue.grant_waiting();
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_EQ(grants[0].lease.gpus, std::vector<std::string>{"a"});
  EXPECT_NE(grants[0].id, *restored);
}

}  // namespace
}  // namespace mcprun
