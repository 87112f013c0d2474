#include "launcher/supervise/failure_report.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>

namespace mcprun {
namespace {

std::vector<WorkerOutcome> three_workers() {
  std::vector<WorkerOutcome> workers(3);
  for (int i = 0; i < 3; ++i) {
    workers[i].rank = workers[i].local_rank = i;
    workers[i].pid = 100 + i;
  }
  workers[1].exit_code = 7;
  workers[1].tail = {"loading data", "\x1b[31mboom\x1b[0m"};
  workers[2].signal = SIGSEGV;
  workers[0].signal = SIGTERM;
  workers[0].stopped_by_launcher = true;
  return workers;
}

TEST(FailureReport, NamesRootCauseOthersAndStopped) {
  auto workers = three_workers();
  workers[1].error_file = "/nonexistent/error.json";
  std::string report = format_failure_report(workers, 1, "node-a", 0, 0);
  EXPECT_NE(report.find("rank:       1 (local rank 1)"), std::string::npos) << report;
  EXPECT_NE(report.find("host:       node-a"), std::string::npos);
  EXPECT_NE(report.find("pid:        101"), std::string::npos);
  EXPECT_NE(report.find("exit code 7"), std::string::npos);
  EXPECT_NE(report.find("    boom"), std::string::npos);
  EXPECT_NE(report.find("rank 2 (local rank 2, pid 102): SIGSEGV (signal 11)"), std::string::npos);
  EXPECT_NE(report.find("Stopped by mcprun: rank(s) 0"), std::string::npos);
}

TEST(FailureReport, NamesTheCollectiveEachRankWasInWhenGiven) {
  const auto workers = three_workers();
  EXPECT_EQ(format_failure_report(workers, 1, "node-a", 0, 0).find("Collectives"),
            std::string::npos);
  const std::string report =
      format_failure_report(workers, 1, "node-a", 0, 0,
                            {{0, "in all_reduce #35 on group 0 (gloo) for 5 s"},
                             {1, "in barrier #35 on group 0 (gloo) for 5 s"}});
  EXPECT_NE(report.find("Collectives at the failure (each rank's last progress record):\n"
                        "  rank 0: in all_reduce #35 on group 0 (gloo) for 5 s\n"
                        "  rank 1: in barrier #35"),
            std::string::npos)
      << report;
}

TEST(FailureReport, ShowsTheHintBesideTheRootCauseOnlyWhenGiven) {
  const auto workers = three_workers();
  EXPECT_EQ(format_failure_report(workers, 1, "node-a", 0, 0).find("hint:"), std::string::npos);
  const std::string report = format_failure_report(
      workers, 1, "node-a", 0, 0, {},
      "ranks 1 and 0 both ran on GPU 0000:00:06.0: --no-pin left every rank the same GPUs");
  EXPECT_NE(report.find("  hint:       ranks 1 and 0 both ran on GPU 0000:00:06.0: --no-pin"),
            std::string::npos)
      << report;
  EXPECT_LT(report.find("hint:"), report.find("last output")) << report;
}

TEST(FailureReport, TheHintReadsTheTailThenTheRecordedMessage) {
  auto path = std::filesystem::temp_directory_path() /
              ("error_hint_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path)
      << R"({"message": {"message": "DistBackendError: NCCL error\nLast error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 60", "extraInfo": {"py_callstack": "", "timestamp": "1"}}})";
  auto workers = three_workers();
  workers[1].error_file = path;
  const auto lines = failure_text(workers[1]);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0], "loading data");
  EXPECT_EQ(lines[4], "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 60");
  std::filesystem::remove(path);
}

TEST(FailureReport, ShowsRecordedErrorFile) {
  auto path =
      std::filesystem::temp_directory_path() / ("error_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << R"({"message": {"message": "RuntimeError: bad batch",
      "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"t.py\"",
                    "timestamp": "1700000000"}}})";
  auto workers = three_workers();
  workers[1].error_file = path;
  std::string report = format_failure_report(workers, 1, "h", 0, 0);
  EXPECT_NE(report.find("message:    RuntimeError: bad batch"), std::string::npos) << report;
  EXPECT_NE(report.find("    Traceback (most recent call last):"), std::string::npos);
  std::ofstream(path) << "not json";
  EXPECT_FALSE(read_error_file(path));
  std::filesystem::remove(path);
}

TEST(ExitCodes, WorkerCodeOrSignal) {
  auto workers = three_workers();
  EXPECT_EQ(exit_code_for(workers[1]), 7);
  EXPECT_EQ(exit_code_for(workers[2]), 128 + SIGSEGV);
}

}  // namespace
}  // namespace mcprun
