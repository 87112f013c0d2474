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
      collective.arrivals.emplace_back(rank, seq * 1'000'000'000LL + (rank == late_rank ? 200'000'000 : rank));
    recent.push_back(collective);
  }
  return recent;
}

TEST(CollectivePicture, EachRankIsARowAndEachCollectivesLastArrivalIsRed) {
  const std::string page = render_collective_picture(collectives(3, 10, 2), {}, {"straggler", 2, {}, ""});
  EXPECT_EQ(count(page, "class=\"row\""), 3u);
  EXPECT_EQ(count(page, "class=\"last\""), 10u);
  EXPECT_EQ(count(page, "class=\"arrival\""), 20u);
  EXPECT_NE(page.find("rank 2: straggler"), std::string::npos);
  EXPECT_EQ(page.find("<script"), std::string::npos);
}

TEST(CollectivePicture, ManyRanksKeepTheMarkedRowsWithinTheLimit) {
  const std::string page = render_collective_picture(collectives(200, 2, 150), {}, {"stall", std::nullopt, {190}, ""});
  EXPECT_EQ(count(page, "class=\"row\""), kMaxPictureRows);
  EXPECT_NE(page.find("data-rank=\"190\""), std::string::npos);
  EXPECT_NE(page.find("rank 190: missing"), std::string::npos);
}

TEST(CollectivePicture, ARanksHostNameIsTextNotMarkup) {
  std::map<int, RankArrivals> ranks;
  ranks[0].host = "<script>alert(1)</script>";
  const std::string page = render_collective_picture(collectives(2, 1, 0), ranks, {"end", std::nullopt, {}, "a & b"});
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_NE(page.find("&lt;script&gt;"), std::string::npos);
  EXPECT_NE(page.find("a &amp; b"), std::string::npos);
}

}  // namespace
}  // namespace mcprun
