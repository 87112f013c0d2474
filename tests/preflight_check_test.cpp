#include "launcher/preflight/preflight_check.hpp"

#include <gtest/gtest.h>

#include <fstream>

#include "common/protocol.hpp"

namespace mcprun {
namespace {

TEST(PreflightBudget, CoversEveryStepAndEveryRoundOfPairs) {
  const PreflightBudget six = preflight_budget(10, 6);
  EXPECT_EQ(six.step_s, 10);
  EXPECT_EQ(six.round_s, 2.5);
  EXPECT_EQ(six.rounds, 5);
  // Start 30, init + all-reduce + liveness 30 + 2, five rounds and the results' 15, report 4.
  EXPECT_EQ(six.bound_s, 81);
  EXPECT_EQ(preflight_budget(10, 7).rounds, 7);  // Odd: each round one rank sits out.
  EXPECT_EQ(preflight_budget(10, 1).rounds, 0);
  // A short deadline keeps a round long enough for a two-rank group to connect.
  EXPECT_EQ(preflight_budget(4, 4).round_s, 2);
  EXPECT_GT(preflight_budget(10, 64).bound_s, preflight_budget(10, 8).bound_s);
}

TEST(PreflightBudget, TheRanksHearTheBoundsEndOnTheLaunchersClock) {
  const PreflightBudget budget = preflight_budget(4, 2);
  PreflightPass pass;
  pass.number = 1;
  pass.report_file = "/run/x/report.json";
  pass.end = std::chrono::steady_clock::time_point(std::chrono::milliseconds(123456));
  pass.min_busbw_gbps = 1.5;
  const Environment env = preflight_env(budget, pass);
  EXPECT_EQ(env.at("MCPRUN_PREFLIGHT_END"), "123.456");
  EXPECT_EQ(env.at("MCPRUN_PREFLIGHT_TIMEOUT"), "4");
  EXPECT_EQ(env.at("MCPRUN_PREFLIGHT_ROUND_TIMEOUT"), "2");
  EXPECT_EQ(env.at("MCPRUN_PREFLIGHT_PASS"), "1");
  EXPECT_EQ(env.at("MCPRUN_PREFLIGHT_MIN_BUSBW"), "1.5");
  EXPECT_EQ(env.at("MCPRUN_PREFLIGHT_REPORT"), "/run/x/report.json");
  EXPECT_EQ(env.at("MCPRUN_COLLECTIVE_WATCH"), "0");
}

TEST(PreflightReport, AMissingOrBrokenReportIsAFailureThatSaysWhere) {
  const auto dir = std::filesystem::path(testing::TempDir());
  const auto missing = read_preflight_report(dir / "no-such-report.json");
  EXPECT_FALSE(missing["ok"].get<bool>());
  EXPECT_NE(missing["verdict"].get<std::string>().find("no-such-report.json"), std::string::npos);
  std::ofstream(dir / "half.json") << R"({"ok": tr)";
  EXPECT_FALSE(read_preflight_report(dir / "half.json")["ok"].get<bool>());
  std::ofstream(dir / "whole.json") << R"({"ok": true, "verdict": "OK"})";
  EXPECT_TRUE(read_preflight_report(dir / "whole.json")["ok"].get<bool>());
}

TEST(PreflightReport, TheFloorIsTheLargestMeasuredSizeOrNone) {
  const auto floor =
      preflight_floor(nlohmann::json::parse(R"({"floor_bytes": 262144, "floor_busbw": 4.5e7})"));
  ASSERT_TRUE(floor);
  EXPECT_EQ(floor->first, 262144);
  EXPECT_EQ(floor->second, 4.5e7);
  // No size finished (a dead host), an old report, a hand-edited one: no floor, no exception.
  for (const char* text :
       {R"({"floor_bytes": null, "floor_busbw": null})", R"({"floor_busbw": 1e9})",
        R"({"floor_bytes": "big", "floor_busbw": 1e9})",
        R"({"floor_bytes": 4096, "floor_busbw": 0})"})
    EXPECT_FALSE(preflight_floor(nlohmann::json::parse(text))) << text;
}

TEST(PreflightReport, ACheckStoppedAtItsBoundSaysSo) {
  const auto report = overran_preflight_report(preflight_budget(10, 6));
  EXPECT_FALSE(report["ok"].get<bool>());
  EXPECT_EQ(
      report["verdict"].get<std::string>().rfind("FAIL: the check ran past its bound of 81 s", 0),
      0u);
  EXPECT_EQ(report["text"].get<std::string>().rfind("mcprun preflight: FAIL", 0), 0u);
}

TEST(PreflightReport, TheVerdictSentToTheOtherNodesKeepsItsFaultsAndFitsOneMessage) {
  const nlohmann::json fault = {{"kind", "slow"}, {"what", "node"}, {"name", "host2"}};
  nlohmann::json report = {{"ok", false},
                           {"verdict", "FAIL: node host2 is SLOW"},
                           {"text", "table\nmcprun preflight: FAIL: node host2 is SLOW\n"},
                           {"faults", {fault}},
                           {"ranks", nlohmann::json::array()}};
  auto verdict = verdict_for_peers(report, "host0");
  EXPECT_EQ(verdict["faults"], nlohmann::json::array({fault}));
  EXPECT_EQ(verdict["text"], report["text"]);
  EXPECT_EQ(verdict["judged_on"], "host0");
  EXPECT_FALSE(verdict.contains("ranks"));

  // A 16K-rank job's table and a fault per rank: the verdict line travels, the table does not.
  report["text"] = std::string(1 << 20, 'x');
  report["faults"] = nlohmann::json::array();
  for (int rank = 0; rank < 16384; ++rank)
    report["faults"].push_back(
        {{"kind", "dead"}, {"what", "rank"}, {"name", std::to_string(rank)}});
  verdict = verdict_for_peers(report, "host0");
  EXPECT_LE(verdict.dump().size(), kMaxFrameBytes / 4);
  EXPECT_GT(verdict["faults"].size(), 0u);
  EXPECT_NE(verdict["text"].get<std::string>().find("FAIL: node host2 is SLOW"), std::string::npos);
  EXPECT_NE(verdict["text"].get<std::string>().find("node host0's summary.json"),
            std::string::npos);
}

}  // namespace
}  // namespace mcprun
