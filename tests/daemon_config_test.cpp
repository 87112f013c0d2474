#include "rendezvousd/daemon_config.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace mcprun {
namespace {

/// The error of a failed load, or "" after a failed expectation.
std::string error_of(const Expected<void>& result) {
  EXPECT_FALSE(result);
  return result ? "" : result.error().message;
}

class DaemonConfigTest : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    std::ofstream(path_) << text;
    return path_.string();
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::filesystem::path path_ = std::filesystem::temp_directory_path() /
                                ("rendezvousd-" + std::to_string(::getpid()) + ".yaml");
};

TEST_F(DaemonConfigTest, ShippedDefaultLoads) {
  DaemonConfig config;
  EXPECT_TRUE(
      load_daemon_config(std::string(MCPRUN_SOURCE_DIR) + "/configs/rendezvousd.yaml", config));
  EXPECT_EQ(config.listen, "0.0.0.0:29400");
  EXPECT_EQ(config.server.lease, std::chrono::seconds(15));
  EXPECT_EQ(config.server.label_precedence, (std::vector<std::string>{"rack", "switch"}));
  // What the systemd unit relies on.
  EXPECT_EQ(config.server.unix_socket, "/run/mcprun/rendezvousd.sock");
  EXPECT_EQ(config.metrics_listen, "127.0.0.1:29401");
  EXPECT_EQ(config.stop_timeout, kDefaultStopTimeout);
  EXPECT_EQ(config.log_level, spdlog::level::info);
}

TEST_F(DaemonConfigTest, ServiceKeysAreReadAndChecked) {
  DaemonConfig config;
  ASSERT_TRUE(load_daemon_config(
      write("metrics_listen: 127.0.0.1:0\nstop_timeout_s: 0.5\nlog_level: warning\n"), config));
  EXPECT_EQ(config.metrics_listen, "127.0.0.1:0");
  EXPECT_EQ(config.stop_timeout, std::chrono::milliseconds(500));
  EXPECT_EQ(config.log_level, spdlog::level::warn);
  ASSERT_TRUE(load_daemon_config(write("metrics_listen: \"\"\n"), config));
  EXPECT_EQ(config.metrics_listen, "");

  auto metrics = error_of(load_daemon_config(write("metrics_listen: localhost:9100\n"), config));
  EXPECT_NE(metrics.find(":1: 'metrics_listen' must be IP:PORT or empty"), std::string::npos)
      << metrics;
  auto listen = error_of(load_daemon_config(write("lease_s: 3\nlisten: 0.0.0.0:99999\n"), config));
  EXPECT_NE(listen.find(":2: 'listen' must be IP:PORT"), std::string::npos) << listen;
  auto level = error_of(load_daemon_config(write("log_level: loud\n"), config));
  EXPECT_NE(level.find("'log_level' must be debug, info, warning or error"), std::string::npos)
      << level;
  EXPECT_FALSE(load_daemon_config(write("stop_timeout_s: 0\n"), config));
}

TEST(ParseListenAddress, TakesIpAndPortOnly) {
  using boost::asio::ip::make_address;
  using boost::asio::ip::tcp;
  EXPECT_EQ(*parse_listen_address("127.0.0.1:0"), tcp::endpoint(make_address("127.0.0.1"), 0));
  EXPECT_EQ(*parse_listen_address("::1:29400"), tcp::endpoint(make_address("::1"), 29400));
  EXPECT_EQ(*parse_listen_address("[::]:29400"), tcp::endpoint(make_address("::"), 29400));
  for (const char* bad : {"", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1",
                          "127.0.0.1:8o", "host:80", ":80", "unix:/run/r.sock"}) {
    auto parsed = parse_listen_address(bad);
    ASSERT_FALSE(parsed) << bad;
    EXPECT_EQ(parsed.error().message.rfind("'" + std::string(bad) + "': ", 0), 0u)
        << parsed.error().message;
  }
}

TEST_F(DaemonConfigTest, KeysAreRead) {
  DaemonConfig config;
  ASSERT_TRUE(
      load_daemon_config(write("listen: 127.0.0.1:0\nlease_s: 2.5\nlabel_precedence: [row]\n"
                               "max_connections: 10\nmax_heartbeats_per_second: 250\n"),
                         config));
  EXPECT_EQ(config.listen, "127.0.0.1:0");
  EXPECT_EQ(config.server.lease, std::chrono::milliseconds(2500));
  EXPECT_EQ(config.server.max_connections, 10u);
  EXPECT_EQ(config.server.max_heartbeats_per_second, 250);
  EXPECT_EQ(config.server.label_precedence, std::vector<std::string>{"row"});
}

TEST_F(DaemonConfigTest, UnknownKeyAndWrongTypeNameTheLine) {
  DaemonConfig config;
  auto unknown = error_of(load_daemon_config(write("lease_s: 3\nleese_s: 4\n"), config));
  EXPECT_NE(unknown.find(":2: unknown key 'leese_s'"), std::string::npos) << unknown;
  auto wrong = error_of(load_daemon_config(write("max_connections: lots\n"), config));
  EXPECT_NE(wrong.find(":1: 'max_connections' must be a count > 0"), std::string::npos) << wrong;
  auto negative = error_of(load_daemon_config(write("lease_s: -1\n"), config));
  EXPECT_NE(negative.find("'lease_s' must be seconds > 0"), std::string::npos);
  EXPECT_FALSE(load_daemon_config("/nonexistent.yaml", config));
}

TEST_F(DaemonConfigTest, ShippedCapsAreTheSessionDefaults) {
  DaemonConfig config;
  config.server.session_limits = {
      .max_queued_bytes = 1, .messages_per_second = 1, .message_burst = 1};
  ASSERT_TRUE(
      load_daemon_config(std::string(MCPRUN_SOURCE_DIR) + "/configs/rendezvousd.yaml", config));
  const SessionLimits defaults;
  EXPECT_EQ(config.server.session_limits.max_queued_bytes, defaults.max_queued_bytes);
  EXPECT_EQ(config.server.session_limits.messages_per_second, defaults.messages_per_second);
  EXPECT_EQ(config.server.session_limits.message_burst, defaults.message_burst);
}

TEST_F(DaemonConfigTest, ShippedSizeIsTheDefaultAndHolds16384Agents) {
  DaemonConfig config;
  config.server.max_connections = 1;
  config.server.listen_backlog = 1;
  ASSERT_TRUE(
      load_daemon_config(std::string(MCPRUN_SOURCE_DIR) + "/configs/rendezvousd.yaml", config));
  const ServerSettings defaults;
  EXPECT_EQ(config.server.max_connections, defaults.max_connections);
  EXPECT_EQ(config.server.listen_backlog, defaults.listen_backlog);
  EXPECT_GE(defaults.max_connections, 16384u);
  EXPECT_GE(defaults.listen_backlog, 16384);
}

TEST_F(DaemonConfigTest, ListenBacklogIsReadAndChecked) {
  DaemonConfig config;
  ASSERT_TRUE(load_daemon_config(write("listen_backlog: 1024\n"), config));
  EXPECT_EQ(config.server.listen_backlog, 1024);
  auto wrong = error_of(load_daemon_config(write("listen_backlog: 0\n"), config));
  EXPECT_NE(wrong.find(":1: 'listen_backlog' must be a count > 0"), std::string::npos) << wrong;
}

TEST_F(DaemonConfigTest, ConnectionCapsAreReadAndChecked) {
  DaemonConfig config;
  ASSERT_TRUE(load_daemon_config(
      write("max_queued_bytes: 65540\nmessages_per_second: 2.5\nmessage_burst: 1\n"), config));
  EXPECT_EQ(config.server.session_limits.max_queued_bytes, kMinQueuedBytes);
  EXPECT_EQ(config.server.session_limits.messages_per_second, 2.5);
  EXPECT_EQ(config.server.session_limits.message_burst, 1);

  const std::pair<const char*, const char*> refused[] = {
      {"max_queued_bytes: 65539\n",
       ":1: 'max_queued_bytes' must be a byte count >= 65540 (one largest frame)"},
      {"max_queued_bytes: lots\n", ":1: 'max_queued_bytes' must be a byte count >= 65540"},
      {"max_queued_bytes: -1\n", ":1: 'max_queued_bytes' must be a byte count >= 65540"},
      {"lease_s: 3\nmessages_per_second: 0\n",
       ":2: 'messages_per_second' must be messages a second > 0"},
      {"messages_per_second: .nan\n", ":1: 'messages_per_second' must be messages a second > 0"},
      {"messages_per_second: .inf\n", ":1: 'messages_per_second' must be messages a second > 0"},
      {"message_burst: 0.5\n", ":1: 'message_burst' must be a message count >= 1"},
      {"message_burst: [1]\n", ":1: 'message_burst' must be a message count >= 1"},
      {"lease_s: .nan\n", ":1: 'lease_s' must be seconds > 0"},
  };
  for (const auto& [text, expected] : refused) {
    auto error = error_of(load_daemon_config(write(text), config));
    EXPECT_NE(error.find(expected), std::string::npos) << text << " -> " << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;  // One line.
  }
}

TEST_F(DaemonConfigTest, TokenFileMustHoldAToken) {
  DaemonConfig config;
  config.token_file = write("\n");
  EXPECT_FALSE(load_token(config));
  config.token_file = write("abc\n");
  EXPECT_TRUE(load_token(config));
  EXPECT_EQ(config.server.token, "abc");
}

}  // namespace
}  // namespace mcprun
