// The init barrier watchdog's clock: --init-timeout runs from the first rank's arrival at the job
// store, never from the attempt's start. Store events are fed as the job store reports them.
#include "launcher/watch/stall_watch.hpp"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <filesystem>
#include <optional>

#include "launcher/store/tcp_store.hpp"

namespace mcprun {
namespace {

using Clock = std::chrono::steady_clock;
using boost::asio::ip::tcp;

constexpr double kInitTimeout = 0.6;
/// Most of the timeout goes by before the first rank arrives, as a slow torch import takes it.
constexpr std::chrono::milliseconds kBeforeFirstArrival{400};

class StallWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    runtime_dir_ =
        std::filesystem::temp_directory_path() / ("stall_watch_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(runtime_dir_);
    tcp::acceptor acceptor(io_, {tcp::v4(), 0});  // Only to give the watch a store to observe.
    store_.emplace(io_, std::move(acceptor), watch().store_observer());
    watch().observe_store(&*store_);
    StallHooks hooks;
    hooks.on_stall = [this](const StallNotice& notice) {
      stalled_at_ = Clock::now();
      notice_ = notice;
    };
    hooks.workers = [] { return std::vector<WorkerStatus>{}; };
    started_ = Clock::now();
    watch().begin_attempt(2, 29500, std::move(hooks));
  }
  void TearDown() override {
    watch_->end_attempt();
    store_.reset();
    watch_.reset();
    std::filesystem::remove_all(runtime_dir_);
  }

  StallWatch& watch() {
    if (!watch_) {
      StallSettings settings;
      settings.init_timeout = kInitTimeout;
      watch_.emplace(io_, settings, "node-a", runtime_dir_);
    }
    return *watch_;
  }
  void store_event(StoreEvent::Kind kind, uint64_t connection, std::string key = "",
                   int64_t value = 0) {
    watch().store_observer()({kind,
                              connection,
                              {boost::asio::ip::make_address("127.0.0.1"),
                               static_cast<unsigned short>(40000 + connection)},
                              std::move(key),
                              value});
  }
  /// Runs the loop until a stall is declared or `limit` passes.
  void run_until_stall(std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    while (!stalled_at_ && Clock::now() < deadline) io_.run_for(std::chrono::milliseconds(20));
  }
  static std::chrono::duration<double> seconds(Clock::duration d) { return d; }

  boost::asio::io_context io_;
  std::filesystem::path runtime_dir_;
  std::optional<StallWatch> watch_;
  std::optional<TcpStoreServer> store_;
  Clock::time_point started_;
  std::optional<Clock::time_point> stalled_at_;
  StallNotice notice_;
};

TEST_F(StallWatchTest, NoRankAtTheStoreIsNoStallHoweverLong) {
  run_until_stall(std::chrono::milliseconds(static_cast<int>(kInitTimeout * 3000)));
  EXPECT_FALSE(stalled_at_);
}

TEST_F(StallWatchTest, TheDeadlineRunsFromTheFirstArrivalNotTheStart) {
  io_.run_for(kBeforeFirstArrival);  // Every rank still importing torch.
  ASSERT_FALSE(stalled_at_);
  const auto first_arrival = Clock::now();
  store_event(StoreEvent::Kind::kConnected, 1);
  run_until_stall(std::chrono::seconds(10));
  ASSERT_TRUE(stalled_at_) << "rank 1 never arrived, yet no stall";
  // A deadline counted from the start would have fired kInitTimeout after it: 0.2 s after the
  // arrival, so a rank arriving just after the first would have been called missing.
  EXPECT_GE(seconds(*stalled_at_ - first_arrival).count(), kInitTimeout);
  EXPECT_NE(notice_.what.find("of the first rank's arrival"), std::string::npos) << notice_.what;
}

TEST_F(StallWatchTest, PassingTheInitBarrierDisarmsTheDeadline) {
  const std::string barrier = "/default_pg/store_based_barrier_key:0";  // torch 2.13's
  store_event(StoreEvent::Kind::kConnected, 1);
  store_event(StoreEvent::Kind::kConnected, 2);
  store_event(StoreEvent::Kind::kAdd, 1, barrier, 1);
  store_event(StoreEvent::Kind::kAdd, 2, barrier, 2);
  run_until_stall(std::chrono::milliseconds(static_cast<int>(kInitTimeout * 3000)));
  EXPECT_FALSE(stalled_at_);
}

}  // namespace
}  // namespace mcprun
