#include "launcher/watch/stall_report.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "common/protocol.hpp"

namespace mcprun {
namespace {

RankProgress rank(int number, int level, std::string state) {
  RankProgress progress;
  progress.rank = number;
  progress.local_rank = number % 2;
  progress.host = number < 2 ? "node-a" : "node-b";
  progress.pid = 100 + number;
  progress.level = level;
  progress.state = std::move(state);
  progress.last_line = "line of rank " + std::to_string(number);
  progress.last_line_age_s = 1.5;
  progress.stack_file = "/logs/attempt_0/" + std::to_string(number % 2) + "/stacks.txt";
  return progress;
}

TEST(StallReport, NamesTheRanksBehindTheFurthestAsMissing) {
  StallNotice notice;
  notice.what = "the process group's init barrier was not passed within --init-timeout 10 s";
  notice.noticed_on = "node-a";
  const std::string report =
      format_stall_report(notice,
                          {rank(3, RankProgress::kConnected, "connected, not at the init barrier"),
                           rank(0, RankProgress::kConnected, "connected, not at the init barrier"),
                           rank(2, RankProgress::kNotConnected, "never connected to the store"),
                           rank(1, RankProgress::kConnected, "connected, not at the init barrier")},
                          4);
  EXPECT_NE(report.find("job STALLED: the process group's init barrier was not passed within "
                        "--init-timeout 10 s (noticed on node-a)"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("arrived: 3 of 4 ranks (0-1,3)"), std::string::npos) << report;
  EXPECT_NE(report.find("missing: 2\n"), std::string::npos) << report;
  EXPECT_NE(report.find("  2*    node-b:0"), std::string::npos) << report;
  EXPECT_NE(report.find("1.5 s ago: line of rank 2"), std::string::npos) << report;
  EXPECT_NE(report.find("rank 2: node-b:/logs/attempt_0/0/stacks.txt"), std::string::npos)
      << report;
  // Sorted by rank.
  EXPECT_LT(report.find("  0     node-a"), report.find("  1     node-a")) << report;
  EXPECT_EQ(report.find("hint:"), std::string::npos) << report;  // No rank's output matched.
}

TEST(StallReport, NamesTheRanksOfALargeCollectiveAsRanges) {
  CollectiveStall stall;
  stall.collective = {"0", {}, "all_reduce", 30, "nccl", 12};
  for (int member = 0; member < 16384; ++member)
    (member == 4096 ? stall.missing : stall.in).push_back(member);
  StallNotice notice;
  notice.kind = StallNotice::Kind::kCollective;
  notice.what = "all_reduce #30 on group 0 (nccl) made no progress";
  notice.collective = stall;
  const std::string report = format_stall_report(notice, {}, 16384);
  EXPECT_NE(report.find("in it: 0-4095,4097-16383; not in it: 4096\n"), std::string::npos)
      << report;
  EXPECT_LT(report.size(), size_t{4096}) << "every rank spelled out";
}

TEST(StallReport, ARankWhoseLastOutputMatchedShowsItsHintUnderItsRow) {
  StallNotice notice;
  notice.what = "the process group's init barrier was not passed within --init-timeout 10 s";
  RankProgress stuck = rank(1, RankProgress::kConnected, "connected, not at the init barrier");
  stuck.hint = "NCCL's bootstrap could not open or reach its peers' sockets at init";
  const std::string report = format_stall_report(
      notice, {rank(0, RankProgress::kArrived, "at the init barrier"), stuck}, 2);
  const auto row = report.find("  1*    node-a:1");
  ASSERT_NE(row, std::string::npos) << report;
  EXPECT_NE(report.find("\n        hint: NCCL's bootstrap could not open", row), std::string::npos)
      << report;
  EXPECT_EQ(report.find("hint:"), report.rfind("hint:")) << report;  // Rank 0 has none.
}

TEST(StallReport, CountsRanksOfNodesThatSentNoReport) {
  StallNotice notice;
  notice.what = "barrier 'checkpoint' was not complete within its timeout of 5 s";
  const std::string report =
      format_stall_report(notice, {rank(0, RankProgress::kArrived, "at barrier 'checkpoint'")}, 4);
  EXPECT_NE(report.find("3 rank(s) on nodes that sent no report"), std::string::npos) << report;
}

TEST(StallReport, ACollectiveStallOf16384RanksIsOneRendezvousFrame) {
  StallNotice notice;
  notice.kind = StallNotice::Kind::kCollective;
  notice.what = "all_reduce #30 on group 0 (nccl) made no progress for --collective-timeout 10 s";
  notice.noticed_on = "node-0";
  CollectiveStall stall;
  stall.collective = {"0", {}, "all_reduce", 30, "nccl", 11};
  for (int rank = 0; rank < 16384; ++rank) {
    (rank == 4096 ? stall.missing : stall.in).push_back(rank);
    // Distinct states, the worst case: only as many as fit are sent, and the rest counted.
    stall.states[rank] = "in all_reduce #30 at train.py:" + std::to_string(rank) + " in step";
  }
  stall.source = "flight_recorder";
  notice.collective = stall;
  nlohmann::json message = to_frame_json(notice, kMaxFrameBytes - 4096);
  message["type"] = "stall";
  message["node"] = std::string(255, 'n');  // What the daemon adds, at its longest.
  EXPECT_LE(encode_frame(message).size(), kFrameHeaderBytes + kMaxFrameBytes);
  EXPECT_GT(message["collective"].value("states_left_out", 0), 0);
  const StallNotice back = stall_notice_from_json(message);
  ASSERT_TRUE(back.collective);
  EXPECT_EQ(back.collective->missing, std::vector<int>{4096});
  EXPECT_EQ(back.collective->in.size(), 16383u);
  EXPECT_EQ(back.what, notice.what);
}

TEST(StallReport, AnInitStallOf16384RanksIsOneRendezvousFrame) {
  StallNotice notice;
  notice.kind = StallNotice::Kind::kInit;
  notice.what = "the process group's init barrier was not passed within --init-timeout 600 s";
  // 2,048 hosts of 8 ranks, each rank's store connection from a scattered ephemeral port.
  for (int host = 0; host < 2048; ++host)
    for (int rank = 0; rank < 8; ++rank)
      notice.arrived["10.0." + std::to_string(host / 256) + "." + std::to_string(host % 256)]
          .push_back(32768 + (host * 7919 + rank * 104729) % 28000);
  ASSERT_GT(to_json(notice).dump().size(), 64u * 1024);  // What used to be sent.
  nlohmann::json message = to_frame_json(notice, kMaxFrameBytes - 4096);
  message["type"] = "stall";
  message["node"] = std::string(255, 'n');
  EXPECT_LE(encode_frame(message).size(), kFrameHeaderBytes + kMaxFrameBytes);
  const StallNotice back = stall_notice_from_json(message);
  EXPECT_GT(back.arrived_left_out, 0u);
  EXPECT_EQ(back.arrived.size() + back.arrived_left_out, 2048u);
  for (const auto& [host, ports] : back.arrived) {
    std::vector<int> sent = notice.arrived.at(host);
    std::sort(sent.begin(), sent.end());
    EXPECT_EQ(ports, sent) << host;
  }
}

TEST(StallReport, NoticeAndProgressSurviveTheWire) {
  StallNotice notice;
  notice.kind = StallNotice::Kind::kHeartbeat;
  notice.what = "rank 5 sent no heartbeat";
  notice.rank = 5;
  notice.arrived = {{"10.0.0.2", {40001, 40002}}};
  notice.noticed_on = "node-a";
  const StallNotice back = stall_notice_from_json(to_json(notice));
  EXPECT_EQ(back.kind, StallNotice::Kind::kHeartbeat);
  EXPECT_EQ(back.rank, 5);
  EXPECT_EQ(back.arrived, notice.arrived);
  EXPECT_EQ(back.noticed_on, "node-a");
  EXPECT_THROW(stall_notice_from_json({{"kind", "bogus"}, {"what", "x"}}), std::exception);

  const RankProgress progress =
      rank(3, RankProgress::kNotConnected, "never connected to the store");
  const RankProgress copy = rank_progress_from_json(to_json(progress));
  EXPECT_EQ(copy.rank, 3);
  EXPECT_EQ(copy.level, RankProgress::kNotConnected);
  EXPECT_EQ(copy.state, progress.state);
  EXPECT_EQ(copy.stack_file, progress.stack_file);
  RankProgress hinted = progress;
  hinted.hint = "rank 3 has LOCAL_RANK=1 but could see 1 GPU(s)";
  EXPECT_EQ(rank_progress_from_json(to_json(hinted)).hint, hinted.hint);
}

}  // namespace
}  // namespace mcprun
