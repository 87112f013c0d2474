#include "rendezvous/lease_book.hpp"

#include <gtest/gtest.h>

namespace mcprun {
namespace {

const auto kAnyPortFree = [](int) { return true; };

TEST(LeaseBook, GrantsDisjointGpusInTopologyOrderAndDistinctPorts) {
  LeaseBook book({"a", "b", "c", "d"}, 29500, 29501);
  auto first = book.grant(1, 2, "alice, job x", kAnyPortFree);
  auto second = book.grant(2, 2, "bob, job y", kAnyPortFree);
  ASSERT_TRUE(first && second);
  EXPECT_EQ(first->gpus, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(second->gpus, (std::vector<std::string>{"c", "d"}));
  EXPECT_NE(first->port, second->port);
  EXPECT_EQ(book.leased_gpus(), 4u);
}

TEST(LeaseBook, ShortageNamesWhoHoldsWhat) {
  LeaseBook book({"a", "b"}, 29500, 29510);
  ASSERT_TRUE(book.grant(1, 2, "alice, job x", kAnyPortFree));
  EXPECT_FALSE(book.grant(2, 1, "bob, job y", kAnyPortFree));
  EXPECT_EQ(book.shortage(1),
            "1 GPU(s) wanted, 0 of 2 free; held by alice, job x (a,b, port 29500)");
}

TEST(LeaseBook, ReleaseFreesGpusAndPortForTheNextJob) {
  LeaseBook book({"a"}, 29500, 29500);
  ASSERT_TRUE(book.grant(1, 1, "alice", kAnyPortFree));
  EXPECT_FALSE(book.grant(2, 0, "bob", kAnyPortFree)) << "the only port is held";
  book.release(1);
  auto next = book.grant(2, 1, "bob", kAnyPortFree);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->port, 29500);
}

TEST(LeaseBook, SkipsPortsTheSystemHoldsAndCpuJobsNeedOnlyAPort) {
  LeaseBook book({}, 29500, 29502);
  auto lease = book.grant(1, 0, "alice", [](int port) { return port == 29502; });
  ASSERT_TRUE(lease);
  EXPECT_TRUE(lease->gpus.empty());
  EXPECT_EQ(lease->port, 29502);
}

}  // namespace
}  // namespace mcprun
