#include "rendezvous/rendezvous_round.hpp"

#include <gtest/gtest.h>

namespace mcprun {
namespace {

using std::chrono::seconds;

NodeInfo node(const std::string& name, const std::string& addr, int nproc = 2,
              std::map<std::string, std::string> labels = {}, int requested_rank = -1) {
  return NodeInfo{name, addr, nproc, 29500, std::move(labels), requested_rank};
}

RoundSettings settings(int min_nodes, int max_nodes) {
  RoundSettings s;
  s.min_nodes = min_nodes;
  s.max_nodes = max_nodes;
  s.join_timeout = seconds(30);
  s.last_call_timeout = seconds(5);
  return s;
}

std::vector<std::string> names(const RoundResult& result) {
  std::vector<std::string> order;
  for (const auto& n : result.nodes) order.push_back(n.node);
  return order;
}

TEST(RankOrder, LabelsByPrecedenceThenAddress) {
  RoundResult result = assign_ranks(
      {node("d", "10.0.0.4", 2, {{"rack", "r2"}, {"switch", "s1"}}),
       node("a", "10.0.0.9", 2, {{"rack", "r1"}, {"switch", "s2"}}),
       node("c", "10.0.0.3", 2, {{"rack", "r1"}, {"switch", "s1"}}),
       node("b", "10.0.0.2", 2, {{"rack", "r1"}, {"switch", "s1"}}), node("e", "10.0.0.1", 2)},
      {"rack", "switch"});
  EXPECT_EQ(names(result), (std::vector<std::string>{"b", "c", "a", "d", "e"}));
  EXPECT_EQ(result.world_size, 10);
  EXPECT_EQ(result.nodes[2].rank_offset, 4);
  EXPECT_EQ(result.master_addr, "10.0.0.2");
}

TEST(RankOrder, ExplicitNodeRankWins) {
  RoundResult result = assign_ranks(
      {node("a", "10.0.0.1"), node("b", "10.0.0.2", 4, {}, 0), node("c", "10.0.0.3")}, {});
  EXPECT_EQ(names(result), (std::vector<std::string>{"b", "a", "c"}));
  EXPECT_EQ(result.nodes[1].rank_offset, 4);
  EXPECT_EQ(result.master_addr, "10.0.0.2");
}

TEST(Round, CompletesAtMaxNodes) {
  const auto t0 = Clock::time_point{};
  RendezvousRound round(settings(3, 3), t0);
  EXPECT_FALSE(round.join(node("a", "1"), t0));
  EXPECT_FALSE(round.join(node("b", "2"), t0 + seconds(1)));
  EXPECT_EQ(round.state(), RendezvousRound::State::kJoining);
  EXPECT_FALSE(round.join(node("c", "3"), t0 + seconds(2)));
  EXPECT_EQ(round.state(), RendezvousRound::State::kComplete);
  EXPECT_EQ(round.result().world_size, 6);
  EXPECT_TRUE(round.join(node("d", "4"), t0 + seconds(3)));  // Closed.
}

TEST(Round, ElasticRoundClosesAfterLastCall) {
  const auto t0 = Clock::time_point{};
  RendezvousRound round(settings(2, 4), t0);
  round.join(node("a", "1"), t0);
  round.join(node("b", "2"), t0 + seconds(1));
  EXPECT_EQ(round.next_deadline(), t0 + seconds(6));
  EXPECT_EQ(round.advance(t0 + seconds(5)), RendezvousRound::State::kJoining);
  round.join(node("c", "3"), t0 + seconds(5));
  EXPECT_EQ(round.advance(t0 + seconds(6)), RendezvousRound::State::kComplete);
  EXPECT_EQ(round.result().nodes.size(), 3u);
}

TEST(Round, JoinTimeoutNamesWhoJoined) {
  const auto t0 = Clock::time_point{};
  RendezvousRound round(settings(3, 3), t0);
  round.join(node("alpha", "10.0.0.1"), t0);
  round.join(node("beta", "10.0.0.2"), t0);
  EXPECT_EQ(round.advance(t0 + seconds(29)), RendezvousRound::State::kJoining);
  EXPECT_EQ(round.advance(t0 + seconds(30)), RendezvousRound::State::kTimedOut);
  EXPECT_EQ(round.timeout_message(),
            "timed out after 30 s: 2 of 3 nodes joined: alpha (10.0.0.1), beta (10.0.0.2)");
}

TEST(Round, LostNodeBeforeCompletionFreesItsPlace) {
  const auto t0 = Clock::time_point{};
  RendezvousRound round(settings(2, 2), t0);
  round.join(node("a", "1"), t0);
  round.leave("a");
  EXPECT_FALSE(round.join(node("a", "1"), t0 + seconds(1)));
  EXPECT_EQ(round.joined(), 1u);
}

TEST(Round, RefusesDuplicatesAndBadRanks) {
  const auto t0 = Clock::time_point{};
  RendezvousRound round(settings(3, 3), t0);
  EXPECT_FALSE(round.join(node("a", "1", 1, {}, 1), t0));
  EXPECT_NE(round.join(node("a", "2"), t0)->find("already joined"), std::string::npos);
  EXPECT_NE(round.join(node("b", "2", 1, {}, 1), t0)->find("already taken"), std::string::npos);
  EXPECT_NE(round.join(node("c", "3", 1, {}, 7), t0)->find("out of range"), std::string::npos);
}

}  // namespace
}  // namespace mcprun
