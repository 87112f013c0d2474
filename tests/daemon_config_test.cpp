#include "rendezvousd/daemon_config.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace mcprun {
namespace {

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
  EXPECT_EQ(load_daemon_config(std::string(MCPRUN_SOURCE_DIR) + "/configs/rendezvousd.yaml", config),
            std::nullopt);
  EXPECT_EQ(config.listen, "0.0.0.0:29400");
  EXPECT_EQ(config.server.lease, std::chrono::seconds(15));
  EXPECT_EQ(config.server.label_precedence, (std::vector<std::string>{"rack", "switch"}));
}

TEST_F(DaemonConfigTest, KeysAreRead) {
  DaemonConfig config;
  ASSERT_EQ(load_daemon_config(write("listen: 127.0.0.1:0\nlease_s: 2.5\nlabel_precedence: [row]\n"
                                     "max_connections: 10\n"),
                               config),
            std::nullopt);
  EXPECT_EQ(config.listen, "127.0.0.1:0");
  EXPECT_EQ(config.server.lease, std::chrono::milliseconds(2500));
  EXPECT_EQ(config.server.max_connections, 10u);
  EXPECT_EQ(config.server.label_precedence, std::vector<std::string>{"row"});
}

TEST_F(DaemonConfigTest, UnknownKeyAndWrongTypeNameTheLine) {
  DaemonConfig config;
  auto unknown = load_daemon_config(write("lease_s: 3\nleese_s: 4\n"), config);
  ASSERT_TRUE(unknown);
  EXPECT_NE(unknown->find(":2: unknown key 'leese_s'"), std::string::npos) << *unknown;
  auto wrong = load_daemon_config(write("max_connections: lots\n"), config);
  ASSERT_TRUE(wrong);
  EXPECT_NE(wrong->find(":1: 'max_connections' must be a count > 0"), std::string::npos) << *wrong;
  auto negative = load_daemon_config(write("lease_s: -1\n"), config);
  ASSERT_TRUE(negative);
  EXPECT_NE(negative->find("'lease_s' must be seconds > 0"), std::string::npos);
  EXPECT_TRUE(load_daemon_config("/nonexistent.yaml", config));
}

TEST_F(DaemonConfigTest, TokenFileMustHoldAToken) {
  DaemonConfig config;
  config.token_file = write("\n");
  EXPECT_TRUE(load_token(config));
  config.token_file = write("abc\n");
  EXPECT_EQ(load_token(config), std::nullopt);
  EXPECT_EQ(config.server.token, "abc");
}

}  // namespace
}  // namespace mcprun
