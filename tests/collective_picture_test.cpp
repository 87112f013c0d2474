#include "launcher/report/collective_picture.hpp"

#include <gtest/gtest.h>

namespace mcprun {
namespace {

size_t count(const std::string& text, const std::string& part) {
  size_t found = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++found;
  return found;
}

std::deque<SeenCollective> collectives(int ranks, int count, int late_rank) {
  std::deque<SeenCollective> recent;
  for (int seq = 0; seq < count; ++seq) {
    SeenCollective collective{"0", seq, {}};
    for (int rank = 0; rank < ranks; ++rank)
      collective.arrivals.emplace_back(
          rank, seq * 1'000'000'000LL + (rank == late_rank ? 200'000'000 : rank));
    recent.push_back(collective);
  }
  return recent;
}

TEST(CollectivePicture, EachRankIsARowAndEachCollectivesLastArrivalIsRed) {
  const std::string page =
      render_collective_picture(collectives(3, 10, 2), {}, {"straggler", 2, {}, ""});
  EXPECT_EQ(count(page, "class=\"row\""), 3u);
  EXPECT_EQ(count(page, "class=\"last\""), 10u);
  EXPECT_EQ(count(page, "class=\"arrival\""), 20u);
  EXPECT_NE(page.find("rank 2: straggler"), std::string::npos);
  EXPECT_EQ(page.find("<script"), std::string::npos);
}

TEST(CollectivePicture, WhoHowMuchAndSinceWhen) {
  // Rank 2 arrives 200 ms after the others at each of 10 collectives, a second apart.
  const std::string page =
      render_collective_picture(collectives(3, 10, 2), {}, {"straggler", 2, {}, ""});
  // Who: the others' mean wait, 200 ms a collective, charged to rank 2 alone.
  EXPECT_EQ(count(page, "class=\"wait\""), 3u);
  EXPECT_NE(page.find("2.00 s (100%)"), std::string::npos) << page;
  EXPECT_NE(page.find("0.00 s (0%)"), std::string::npos);
  // How much: a lag line per rank, the straggler's in red.
  EXPECT_EQ(count(page, "class=\"lag\""), 3u);
  EXPECT_NE(page.find("class=\"lag\" data-rank=\"2\""), std::string::npos);
  EXPECT_NE(page.find(">200 ms</text>"), std::string::npos);  // The lag chart's top.
  // Since when: the pace between the 10 collectives, each one held back by rank 2.
  EXPECT_EQ(count(page, "class=\"held\""), 9u);
  EXPECT_EQ(count(page, "class=\"collective\""), 0u);
  EXPECT_NE(page.find(">9.2 s</text>"), std::string::npos);  // The time axis' end.
}

TEST(CollectivePicture, ManyRanksKeepTheMarkedRowsWithinTheLimit) {
  const std::string page =
      render_collective_picture(collectives(200, 2, 150), {}, {"stall", std::nullopt, {190}, ""});
  EXPECT_EQ(count(page, "class=\"row\""), kMaxPictureRows);
  EXPECT_NE(page.find("data-rank=\"190\""), std::string::npos);
  EXPECT_NE(page.find("rank 190: missing"), std::string::npos);
}

TEST(CollectivePicture, ARanksHostNameIsTextNotMarkup) {
  std::map<int, RankArrivals> ranks;
  ranks[0].host = "<script>alert(1)</script>";
  const std::string page =
      render_collective_picture(collectives(2, 1, 0), ranks, {"end", std::nullopt, {}, "a & b"});
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_NE(page.find("&lt;script&gt;"), std::string::npos);
  EXPECT_NE(page.find("a &amp; b"), std::string::npos);
}

}  // namespace
}  // namespace mcprun
