#include "common/connection_limits.hpp"

#include <gtest/gtest.h>

namespace mcprun {
namespace {

TEST(ConnectionLimits, NothingToSayWhenTheHostHoldsEveryConnection) {
  EXPECT_FALSE(connection_limits_warning("rendezvousd", 16384, kListenBacklog, {20000, 16384}));
}

TEST(ConnectionLimits, OneLineNamesEachShortLimitAndHowToRaiseIt) {
  auto warning =
      connection_limits_warning("the store for 16384 ranks", 16384, kListenBacklog, {1024, 4096});
  ASSERT_TRUE(warning);
  EXPECT_EQ(warning->find('\n'), std::string::npos) << *warning;
  EXPECT_EQ(warning->rfind("the store for 16384 ranks needs more than this host allows 16384 "
                           "connections at once: ulimit -n is 1024 (raise the hard limit to 16448",
                           0),
            0u)
      << *warning;
  EXPECT_NE(warning->find("net.core.somaxconn is 4096 (sysctl -w net.core.somaxconn=16384)"),
            std::string::npos)
      << *warning;
}

TEST(ConnectionLimits, ABacklogAskedBelowTheSizeIsNamedEvenWhereSomaxconnWouldHold) {
  auto warning = connection_limits_warning("rendezvousd", 4096, 1024, {20000, 4096});
  ASSERT_TRUE(warning);
  EXPECT_NE(warning->find("the listen backlog asked for is 1024"), std::string::npos) << *warning;
  EXPECT_EQ(warning->find("somaxconn"), std::string::npos) << *warning;
}

TEST(ConnectionLimits, AnUnknownSomaxconnLeavesOnlyTheBacklogAskedFor) {
  EXPECT_FALSE(connection_limits_warning("rendezvousd", 4096, kListenBacklog, {20000, 0}));
}

}  // namespace
}  // namespace mcprun
