#include "launcher/supervise/output_relay.hpp"

#include <gtest/gtest.h>

namespace mcprun {
namespace {

TEST(ConsolePrefix, DefaultIsRankWhenSeveral) {
  EXPECT_EQ(console_prefix(std::nullopt, 3, 1, "default", true), "[rank3]:");
  EXPECT_EQ(console_prefix(std::nullopt, 0, 0, "default", false), "");
}

TEST(ConsolePrefix, TorchrunTemplateMacros) {
  EXPECT_EQ(console_prefix("[rank${rank}]: ", 5, 1, "default", true), "[rank5]: ");
  EXPECT_EQ(console_prefix("[${role_name}${local_rank}]:", 5, 1, "trainer", true), "[trainer1]:");
  EXPECT_EQ(console_prefix("$role_name/$rank:", 2, 0, "w", false), "w/2:");  // Applies to one rank too.
}

TEST(ConsolePrefix, SafeSubstituteLeavesTheRestAlone) {
  EXPECT_EQ(console_prefix("$$${rank}", 1, 0, "r", true), "$1");
  EXPECT_EQ(console_prefix("${host} $ranks ${rank", 1, 0, "r", true), "${host} $ranks ${rank");
  EXPECT_EQ(console_prefix("cost $5 $", 1, 0, "r", true), "cost $5 $");
}

}  // namespace
}  // namespace mcprun
