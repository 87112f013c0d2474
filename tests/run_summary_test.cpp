#include "launcher/report/run_summary.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>

#include "common/exit_status.hpp"
#include "tests/temp_dir.hpp"

namespace mcprun {
namespace {

using namespace std::chrono_literals;

/// A summary of a two-rank job "job42" on node-a, with its run folder in a temp dir.
class RunSummaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.rdzv_id = "job42";
    config_.job_timeout = 1;
    config_.summary_json = (dir_ / "out" / "summary.json").string();
    config_.junit = (dir_ / "out" / "junit.xml").string();
  }

  WorkerOutcome worker(int rank, int exit_code, int signal = 0, bool stopped = false) {
    WorkerOutcome outcome;
    outcome.rank = rank;
    outcome.local_rank = rank;
    outcome.pid = 1000 + rank;
    outcome.exit_code = exit_code;
    outcome.signal = signal;
    outcome.stopped_by_launcher = stopped;
    outcome.exit_time = std::chrono::system_clock::now() + 1500ms;
    outcome.error_file = dir_ / "attempt_0" / std::to_string(rank) / "error.json";
    return outcome;
  }
  AttemptFiles files() const { return {dir_ / "attempt_0", true}; }
  /// Rank 1 fails with exit code 7 after two lines; mcprun stops rank 0 with SIGTERM.
  AttemptResult failed_attempt() {
    AttemptResult result;
    result.end = AttemptResult::End::kWorkerFailed;
    result.workers = {worker(0, 0, SIGTERM, true), worker(1, 7)};
    result.workers[1].tail = {"loading shard 17", "ValueError: bad shard 17"};
    result.first_failure = 1;
    return result;
  }

  testing::TempDir dir_{"run_summary_test"};
  LaunchConfig config_;
};

TEST_F(RunSummaryTest, FailedRankJsonFields) {
  RunSummary summary(config_, "node-a");
  summary.begin_attempt();
  summary.end_attempt(failed_attempt(), files(), 2);
  const auto json = summary.format_json(7);
  EXPECT_EQ(json["result"], "failed");
  EXPECT_EQ(json["exit_code"], 7);
  EXPECT_EQ(json["root_cause"],
            "rank 1 on node-a exited with exit code 7: ValueError: bad shard 17");
  EXPECT_TRUE(json["hint"].is_null());  // "bad shard 17" is no known signature.
  EXPECT_EQ(json["world_size"], 2);
  EXPECT_EQ(json["restarts"], 0);
  EXPECT_EQ(json["host"], "node-a");
  EXPECT_EQ(json["rdzv_id"], "job42");
  EXPECT_EQ(json["mcprun_version"], MCPRUN_PROJECT_VERSION);
  EXPECT_GE(json["total_time_s"].get<double>(), 0);
  ASSERT_EQ(json["ranks"].size(), 2u);
  const auto& stopped = json["ranks"][0];
  EXPECT_EQ(stopped["signal"], (nlohmann::ordered_json{{"name", "SIGTERM"}, {"number", 15}}));
  EXPECT_FALSE(stopped.contains("exit_code"));
  EXPECT_EQ(stopped["root_cause"], false);
  EXPECT_EQ(stopped["stopped_by_mcprun"], true);
  const auto& failed = json["ranks"][1];
  EXPECT_EQ(failed["rank"], 1);
  EXPECT_EQ(failed["local_rank"], 1);
  EXPECT_EQ(failed["exit_code"], 7);
  EXPECT_EQ(failed["root_cause"], true);
  EXPECT_EQ(failed["stalled"], false);
  EXPECT_NEAR(failed["duration_s"].get<double>(), 1.5, 0.5);
  EXPECT_EQ(failed["log"]["stdout"], (dir_ / "attempt_0" / "1" / "stdout.log").string());
  EXPECT_EQ(failed["log"]["stderr"], (dir_ / "attempt_0" / "1" / "stderr.log").string());
}

TEST_F(RunSummaryTest, TheFailuresHintIsItsOwnFieldAndANewAttemptClearsIt) {
  RunSummary summary(config_, "node-a");
  summary.begin_attempt();
  summary.end_attempt(failed_attempt(), files(), 2);
  summary.set_hint("rank 1 has LOCAL_RANK=1 but could see 1 GPU(s)");
  EXPECT_EQ(summary.format_json(7)["hint"], "rank 1 has LOCAL_RANK=1 but could see 1 GPU(s)");
  summary.begin_attempt();
  summary.end_attempt(failed_attempt(), files(), 2);
  EXPECT_TRUE(summary.format_json(7)["hint"].is_null());
}

TEST_F(RunSummaryTest, RootCauseIsWhatRecordWrote) {
  std::filesystem::create_directories(dir_ / "attempt_0" / "1");
  std::ofstream(dir_ / "attempt_0" / "1" / "error.json")
      << R"({"message": {"message": "RuntimeError: shard 17 is corrupt\nmore", "extraInfo": {"py_callstack": "Traceback:\n  File x", "timestamp": "1"}}})";
  RunSummary summary(config_, "node-a");
  summary.end_attempt(failed_attempt(), files(), 2);
  EXPECT_EQ(summary.format_json(7)["root_cause"],
            "rank 1 on node-a exited with exit code 7: RuntimeError: shard 17 is corrupt");
  const std::string junit = summary.format_junit(7);
  EXPECT_NE(junit.find("error: RuntimeError: shard 17 is corrupt&#10;more"), std::string::npos)
      << junit;
  EXPECT_NE(junit.find("\n    File x"), std::string::npos) << junit;
}

TEST_F(RunSummaryTest, FailedRankInJunitWithItsTail) {
  RunSummary summary(config_, "node-a");
  AttemptResult result = failed_attempt();
  result.workers[1].tail.push_back("a & b <c> \"q\" \x1b[31mred\x1b[0m");
  summary.end_attempt(result, files(), 2);
  const std::string junit = summary.format_junit(7);
  EXPECT_EQ(junit.rfind("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite "
                        "name=\"mcprun.job42\" tests=\"2\" "
                        "failures=\"1\" errors=\"0\" skipped=\"1\" time=\"",
                        0),
            0u)
      << junit;
  EXPECT_NE(junit.find("hostname=\"node-a\""), std::string::npos);
  EXPECT_NE(junit.find("<testcase classname=\"mcprun.job42\" name=\"rank 0\" time=\""),
            std::string::npos);
  EXPECT_NE(junit.find("<skipped message=\"stopped by mcprun: rank 1 on node-a exited with exit "
                       "code 7: a &amp; b"),
            std::string::npos)
      << junit;
  EXPECT_NE(
      junit.find(
          "<failure message=\"rank 1 on node-a exited with exit code 7: a &amp; b &lt;c&gt; "
          "&quot;q&quot; \\x1b[31mred\\x1b[0m\" type=\"failed\">rank 1 (local rank 1, pid 1001) "
          "on node-a: exit code 7\nlast output (3 lines):\n  loading shard 17\n  ValueError: bad "
          "shard 17\n  a &amp; b &lt;c&gt; &quot;q&quot; \\x1b[31mred\\x1b[0m</failure>"),
      std::string::npos)
      << junit;
  EXPECT_EQ(junit.substr(junit.size() - 13), "</testsuite>\n");
}

TEST_F(RunSummaryTest, XmlEscapeLeavesOnlyWhatXml10Carries) {
  EXPECT_EQ(xml_escape("plain text, é ✓ 😀"), "plain text, é ✓ 😀");
  EXPECT_EQ(xml_escape("a&b<c>\"d\"'e'"), "a&amp;b&lt;c&gt;&quot;d&quot;&apos;e&apos;");
  EXPECT_EQ(xml_escape("tab\tnl\ncr\r"), "tab&#9;nl&#10;cr&#13;");
  EXPECT_EQ(xml_escape(std::string("nul\0bell\x07"
                                   "esc\x1b"
                                   "del\x7f",
                                   17)),
            "nul\\x00bell\\x07esc\\x1bdel\x7f");
  EXPECT_EQ(xml_escape("bad \xff byte"), "bad \\xff byte");
  EXPECT_EQ(xml_escape("cut \xe2\x82"), "cut \\xe2\\x82");
  EXPECT_EQ(xml_escape("overlong \xc0\xaf"), "overlong \\xc0\\xaf");
  EXPECT_EQ(xml_escape("surrogate \xed\xa0\x80"), "surrogate \\xed\\xa0\\x80");
  EXPECT_EQ(xml_escape("nonchar \xef\xbf\xbe"), "nonchar \\xef\\xbf\\xbe");
  EXPECT_EQ(xml_escape("beyond \xf4\x90\x80\x80"), "beyond \\xf4\\x90\\x80\\x80");
}

TEST_F(RunSummaryTest, StalledRankIsMarkedAsTheReportMarksIt) {
  RunSummary summary(config_, "node-a");
  AttemptResult result;
  result.end = AttemptResult::End::kStalled;
  result.stall = StallNotice{};
  result.stall->what = "the process group's init barrier was not passed within --init-timeout 5 s";
  result.workers = {worker(0, 0, SIGTERM, true), worker(1, 0, SIGTERM, true)};
  summary.stall_ranks = {
      {0, 0, "node-a", 1000, RankProgress::kConnected, "connected, not at the init barrier", "up",
       1, "", ""},
      {1, 1, "node-a", 1001, RankProgress::kNotConnected, "never connected to the store",
       "sleeping", 1, "/logs/attempt_0/1/stacks.txt", "ranks 1 and 0 both ran on GPU 0000:00:06.0"},
      {2, 0, "node-b", 2000, RankProgress::kConnected, "connected, not at the init barrier", "up",
       1, "", ""}};
  summary.end_attempt(result, files(), 4);
  summary.set_hint("ranks 1 and 0 both ran on GPU 0000:00:06.0");
  const auto json = summary.format_json(kExitStalled);
  EXPECT_EQ(json["result"], "stalled");
  EXPECT_EQ(json["root_cause"], result.stall->what);
  EXPECT_EQ(json["ranks"][0]["stalled"], false);
  EXPECT_EQ(json["ranks"][1]["stalled"], true);
  EXPECT_EQ(json["ranks"][1]["stack_dump"], "/logs/attempt_0/1/stacks.txt");
  EXPECT_EQ(json["hint"], "ranks 1 and 0 both ran on GPU 0000:00:06.0");
  EXPECT_EQ(json["ranks"][1]["hint"], "ranks 1 and 0 both ran on GPU 0000:00:06.0");
  EXPECT_FALSE(json["ranks"][0].contains("hint"));  // Its output matched nothing.
  const std::string junit = summary.format_junit(kExitStalled);
  EXPECT_NE(junit.find("failures=\"1\" errors=\"0\" skipped=\"1\""), std::string::npos) << junit;
  EXPECT_NE(junit.find("name=\"rank 1\" time=\""), std::string::npos);
  EXPECT_NE(
      junit.find("<failure message=\"the process group&apos;s init barrier was not passed within "
                 "--init-timeout 5 s\" type=\"stalled\">"),
      std::string::npos)
      << junit;
  EXPECT_NE(
      junit.find(
          "at the stall: never connected to the store\nstack dump: /logs/attempt_0/1/stacks.txt\n"
          "last output"),
      std::string::npos)
      << junit;
}

TEST_F(RunSummaryTest, TimeoutAndInterruptFailEveryStoppedRank) {
  RunSummary summary(config_, "node-a");
  AttemptResult result;
  result.end = AttemptResult::End::kPeerStopped;
  result.peer_reason = "the job ran past --timeout 1 s";
  result.peer_exit_code = kExitJobTimeout;
  result.workers = {worker(0, 0, SIGTERM, true), worker(1, 0, SIGTERM, true)};
  summary.end_attempt(result, files(), 2);
  EXPECT_EQ(summary.format_json(kExitJobTimeout)["result"], "timeout");
  EXPECT_EQ(summary.format_json(kExitJobTimeout)["root_cause"], "the job ran past --timeout 1 s");
  EXPECT_NE(summary.format_junit(kExitJobTimeout).find("tests=\"2\" failures=\"2\""),
            std::string::npos);

  result.end = AttemptResult::End::kInterrupted;
  result.interrupt_signal = SIGINT;
  summary.end_attempt(result, files(), 2);
  const auto json = summary.format_json(exit_code_for_signal(SIGINT));
  EXPECT_EQ(json["result"], "interrupted");
  EXPECT_EQ(json["root_cause"], "mcprun was interrupted by SIGINT (signal 2)");
  EXPECT_EQ(json["restarts"], 1);  // Two attempts recorded.
}

TEST_F(RunSummaryTest, SuccessHasEveryRankExitZero) {
  RunSummary summary(config_, "node-a");
  AttemptResult result;
  result.workers = {worker(0, 0), worker(1, 0)};
  summary.end_attempt(result, {dir_ / "attempt_0", false}, 2);
  const auto json = summary.format_json(kExitSuccess);
  EXPECT_EQ(json["result"], "success");
  EXPECT_TRUE(json["root_cause"].is_null());
  for (const auto& rank : json["ranks"]) {
    EXPECT_EQ(rank["exit_code"], 0);
    EXPECT_TRUE(rank["log"].is_null());  // Not kept without --log-dir.
  }
  const std::string junit = summary.format_junit(kExitSuccess);
  EXPECT_NE(junit.find("tests=\"2\" failures=\"0\" errors=\"0\" skipped=\"0\""), std::string::npos);
  EXPECT_EQ(junit.find("<failure"), std::string::npos);
}

TEST_F(RunSummaryTest, APreflightThatStoppedTheLaunchIsTheRootCause) {
  RunSummary summary(config_, "node-a");
  EXPECT_TRUE(summary.format_json(0)["preflight"].is_null()) << "null without --preflight";
  summary.set_preflight(
      {{"ok", false}, {"verdict", "FAIL: node host3 is DEAD"}, {"floor_busbw", 1e9}});
  const auto json = summary.format_json(kExitPreflightFailed);
  EXPECT_EQ(json["result"], "failed");
  EXPECT_EQ(json["root_cause"], "preflight: FAIL: node host3 is DEAD");
  EXPECT_EQ(json["preflight"]["floor_busbw"], 1e9);
  EXPECT_TRUE(json["world_size"].is_null()) << "the preflight is no attempt";
}

TEST_F(RunSummaryTest, AnEndingNoAttemptExplainsIsTheLastLoggedError) {
  RunSummary summary(config_, "node-a");
  spdlog::error("job 'job42' at 127.0.0.1:1: connection refused");
  const auto json = summary.format_json(kExitRendezvous);
  EXPECT_EQ(json["result"], "failed");
  EXPECT_EQ(json["root_cause"],
            "rendezvous failed: job 'job42' at 127.0.0.1:1: connection refused");
  EXPECT_TRUE(json["world_size"].is_null());
  EXPECT_TRUE(json["ranks"].empty());
  const std::string junit = summary.format_junit(kExitRendezvous);
  EXPECT_NE(junit.find("tests=\"1\" failures=\"1\""), std::string::npos) << junit;
  EXPECT_NE(junit.find("name=\"mcprun\""), std::string::npos) << junit;

  // A worker failed, the restart's rendezvous did not form: the ending is the rendezvous's.
  summary.end_attempt(failed_attempt(), files(), 2);
  EXPECT_EQ(summary.format_json(kExitRendezvous)["root_cause"],
            "rendezvous failed: job 'job42' at 127.0.0.1:1: connection refused");
  EXPECT_EQ(summary.format_json(7)["result"], "failed");
  EXPECT_EQ(summary.format_json(kExitJobTimeout)["result"], "timeout");
}

TEST_F(RunSummaryTest, WritesBothFilesAtomically) {
  {
    RunSummary summary(config_, "node-a");
    summary.end_attempt(failed_attempt(), files(), 2);
    summary.write(7);
  }
  std::ifstream json_file(config_.summary_json);
  const auto json = nlohmann::json::parse(json_file);
  EXPECT_EQ(json["result"], "failed");
  EXPECT_TRUE(std::filesystem::exists(config_.junit));
  for (const auto& entry : std::filesystem::directory_iterator(dir_ / "out"))
    EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << entry.path();
}

TEST_F(RunSummaryTest, PathsAreTriedBeforeTheJobStarts) {
  // A missing folder is made, and the try leaves nothing behind in it.
  EXPECT_TRUE(RunSummary(config_, "node-a").check_writable());
  EXPECT_TRUE(std::filesystem::is_empty(dir_ / "out"));
  // A file where a folder should be: one line naming the flag, the path and the folder.
  std::ofstream(dir_ / "file") << "x";
  LaunchConfig blocked = config_;
  blocked.junit = (dir_ / "file" / "junit.xml").string();
  auto refused = RunSummary(blocked, "node-a").check_writable();
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().message, "--junit " + blocked.junit + ": cannot write in " +
                                         (dir_ / "file").string() + ": Not a directory");
  blocked.summary_json = (dir_ / "file" / "deeper" / "summary.json").string();
  refused = RunSummary(blocked, "node-a").check_writable();
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().message, "--summary-json " + blocked.summary_json + ": cannot create " +
                                         (dir_ / "file" / "deeper").string() + ": Not a directory");
  // Under --dry-run nothing is written, so nothing is tried.
  blocked.dry_run = true;
  EXPECT_TRUE(RunSummary(blocked, "node-a").check_writable());
}

TEST_F(RunSummaryTest, WritesNothingUnlessAskedOrUnderDryRun) {
  LaunchConfig dry = config_;
  dry.dry_run = true;
  RunSummary(dry, "node-a").write(0);
  LaunchConfig plain;
  RunSummary(plain, "node-a").write(0);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "out"));
}

}  // namespace
}  // namespace mcprun
