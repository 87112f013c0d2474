#include "launcher/watch/file_timer.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/event_loop.hpp"
#include "common/unique_fd.hpp"

namespace mcprun {
namespace {

/// How long a test waits for a report that should come.
constexpr std::chrono::seconds kTestDeadline{30};
/// How late after its expiration a timer may be reported.
constexpr double kReportLatency = 0.1;

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// The line torch's FileTimerRequest.to_json() writes.
std::string request(pid_t pid, const std::string& scope, double expiration, int signal) {
  return nlohmann::json{{"version", 1},
                        {"pid", pid},
                        {"scope_id", scope},
                        {"expiration_time", expiration},
                        {"signal", signal}}
             .dump() +
         "\n";
}

class FileTimerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::filesystem::temp_directory_path() /
            ("file_timer_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    server_ = std::make_unique<FileTimerServer>(io_, path_, [this](const ExpiredTimer& timer) {
      expired_.push_back(timer);
      report_times_.push_back(now());
    });
  }

  /// Writes as torch's FileTimerClient does: open non-blocking, one write, close.
  void send(const std::string& text) {
    UniqueFd fifo(::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
    ASSERT_TRUE(fifo.valid()) << std::strerror(errno);
    ASSERT_EQ(::write(fifo.get(), text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }

  /// Runs the loop until `count` reports arrived; false if they did not within the deadline.
  bool wait_for_reports(size_t count) {
    return run_until(
        io_, [&] { return expired_.size() >= count; }, kTestDeadline);
  }

  /// Runs the loop until the wall clock reaches `epoch_seconds`.
  void run_past(double epoch_seconds) {
    const auto wait = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(epoch_seconds - now()));
    run_until(
        io_, [] { return false; }, wait);
  }

  boost::asio::io_context io_;
  std::filesystem::path path_;
  std::unique_ptr<FileTimerServer> server_;
  std::vector<ExpiredTimer> expired_;
  std::vector<double> report_times_;
};

TEST_F(FileTimerTest, CreatesAPrivateFifoAndUnlinksItOnDestruction) {
  struct stat fifo;
  ASSERT_EQ(::stat(path_.c_str(), &fifo), 0);
  EXPECT_TRUE(S_ISFIFO(fifo.st_mode));
  EXPECT_EQ(fifo.st_mode & 0777, 0600u);
  EXPECT_EQ(server_->path(), path_);
  server_.reset();
  EXPECT_FALSE(std::filesystem::exists(path_));
}

TEST_F(FileTimerTest, ReplacesAStaleFifoAndNamesThePathOnFailure) {
  server_.reset();
  ASSERT_EQ(::mkfifo(path_.c_str(), 0600), 0);
  EXPECT_NO_THROW(FileTimerServer(io_, path_, [](const ExpiredTimer&) {}));
  const auto missing = path_ / "no" / "such" / "dir";
  try {
    FileTimerServer server(io_, missing, [](const ExpiredTimer&) {});
    ADD_FAILURE() << "no exception";
  } catch (const std::system_error& error) {
    EXPECT_NE(std::string(error.what()).find(missing.string()), std::string::npos) << error.what();
  }
}

TEST_F(FileTimerTest, ExpiredScopeIsReportedOnceWithItsFields) {
  const double expiration = now() + 0.3;
  send(request(4242, "train.py#17", expiration, 9));
  send(request(4242, "train.py#30", expiration + 0.3, 15));  // Same pid: dropped with the first.
  ASSERT_TRUE(wait_for_reports(1));
  EXPECT_EQ(expired_[0].pid, 4242);
  EXPECT_EQ(expired_[0].scope_id, "train.py#17");
  EXPECT_DOUBLE_EQ(expired_[0].expiration_time, expiration);
  EXPECT_EQ(expired_[0].signal, 9);
  EXPECT_GE(report_times_[0], expiration);
  EXPECT_LT(report_times_[0] - expiration, kReportLatency);
  run_past(expiration + 0.6);
  EXPECT_EQ(expired_.size(), 1u);
}

TEST_F(FileTimerTest, ReleasedScopeIsNeverReported) {
  const double expiration = now() + 0.3;
  send(request(7, "step", expiration, 9));
  send(request(7, "step", -1, 0));
  run_past(expiration + 0.3);
  EXPECT_TRUE(expired_.empty());
}

TEST_F(FileTimerTest, ClearedPidIsNeverReported) {
  const double expiration = now() + 0.3;
  // The FIFO is read in order: once the expired marker is reported, pid 7's request was read.
  send(request(7, "step", expiration, 9) + request(8, "marker", now() - 1, 0));
  ASSERT_TRUE(wait_for_reports(1));
  server_->clear_pid(7);
  run_past(expiration + 0.3);
  ASSERT_EQ(expired_.size(), 1u);
  EXPECT_EQ(expired_[0].pid, 8);
}

TEST_F(FileTimerTest, MalformedLinesAreIgnored) {
  send("not json\n");
  send(R"({"pid": "seven", "scope_id": "x", "expiration_time": 1, "signal": 9})"
       "\n");
  send(R"({"pid": 7, "expiration_time": 1})"
       "\n");
  send("[1, 2, 3]\n");
  send(R"({"version": 2, "pid": 7, "scope_id": "x", "expiration_time": 1, "signal": 9})"
       "\n");
  send(std::string(2 * kMaxTimerRequestBytes, 'x') + "\n");
  send("\n");
  // A line that arrives in pieces is joined.
  const std::string good = request(8, "ok", now() - 1, 0);
  UniqueFd writer(::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
  ASSERT_EQ(::write(writer.get(), good.data(), 10), 10);
  run_until(
      io_, [] { return false; }, std::chrono::milliseconds(50));
  ASSERT_EQ(::write(writer.get(), good.data() + 10, good.size() - 10),
            static_cast<ssize_t>(good.size() - 10));
  ASSERT_TRUE(wait_for_reports(1));
  EXPECT_EQ(expired_[0].pid, 8);
  EXPECT_EQ(expired_[0].scope_id, "ok");
  EXPECT_EQ(expired_.size(), 1u);
}

TEST_F(FileTimerTest, FarFutureExpirationJustWaits) {
  send(request(9, "forever", 1e300, 9));
  run_until(
      io_, [] { return false; }, std::chrono::milliseconds(50));
  EXPECT_TRUE(expired_.empty());
}

TEST_F(FileTimerTest, EachPidIsReportedOnItsOwnExpiry) {
  const double first = now() + 0.2, second = now() + 0.5;
  send(request(200, "second", second, 9) + request(100, "first", first, 15));
  ASSERT_TRUE(wait_for_reports(2));
  EXPECT_EQ(expired_[0].pid, 100);
  EXPECT_EQ(expired_[0].scope_id, "first");
  EXPECT_EQ(expired_[1].pid, 200);
  EXPECT_EQ(expired_[1].signal, 9);
  EXPECT_LT(report_times_[0] - first, kReportLatency);
  EXPECT_GE(report_times_[1], second);
  EXPECT_LT(report_times_[1] - second, kReportLatency);
}

TEST_F(FileTimerTest, PrefersTheEarliestScopeThatNamesASignal) {
  // torch's server kills with the first expired timer that has a signal.
  const double past = now() - 2;
  send(request(5, "no signal", past, 0) + request(5, "kill", past + 1, 15) +
       request(5, "later kill", past + 1.5, 9));
  ASSERT_TRUE(wait_for_reports(1));
  EXPECT_EQ(expired_[0].scope_id, "kill");
  EXPECT_EQ(expired_[0].signal, 15);
  run_until(
      io_, [] { return false; }, std::chrono::milliseconds(50));
  EXPECT_EQ(expired_.size(), 1u);
}

TEST_F(FileTimerTest, ListenerMayDestroyTheServer) {
  server_.reset();
  server_ = std::make_unique<FileTimerServer>(io_, path_, [this](const ExpiredTimer& timer) {
    expired_.push_back(timer);
    server_.reset();
  });
  send(request(1, "a", now() - 1, 9) + request(2, "b", now() - 1, 9));
  ASSERT_TRUE(wait_for_reports(1));
  EXPECT_EQ(expired_.size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(path_));
}

}  // namespace
}  // namespace mcprun
