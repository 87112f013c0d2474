#include "launcher/report/node_metrics.hpp"

#include <gtest/gtest.h>

namespace mcprun {
namespace {

NodeMetrics two_ranks() {
  NodeMetrics metrics;
  metrics.workers_running = 2;
  metrics.arrivals[0] = {"a", 0, 120, 10, 2.5, 0.001};
  metrics.arrivals[1] = {"b", 1, 120, 110, 0.125, 0.21};
  return metrics;
}

TEST(NodeMetrics, EveryRankHasItsCountersUnderItsRankNodeAndLocalRank) {
  const std::string text = render_node_metrics(two_ranks());
  EXPECT_NE(
      text.find("mcprun_rank_collectives_total{rank=\"1\",node=\"b\",local_rank=\"1\"} 120\n"),
      std::string::npos)
      << text;
  EXPECT_NE(
      text.find("mcprun_rank_wait_seconds_total{rank=\"0\",node=\"a\",local_rank=\"0\"} 2.5\n"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("# TYPE mcprun_rank_arrived_last_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("mcprun_workers{state=\"running\"} 2\n"), std::string::npos);
  EXPECT_EQ(text.find("mcprun_straggler{"), std::string::npos);  // Nobody named: no sample.
}

TEST(NodeMetrics, TheStragglerIsOneSampleWithItsLabels) {
  NodeMetrics metrics = two_ranks();
  metrics.straggler = 1;
  metrics.stragglers_named = 1;
  const std::string text = render_node_metrics(metrics);
  EXPECT_NE(text.find("mcprun_straggler{rank=\"1\",node=\"b\",local_rank=\"1\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("mcprun_stragglers_named_total 1\n"), std::string::npos);
}

TEST(NodeMetrics, AHostNameFromARanksRecordCannotBreakTheFormat) {
  NodeMetrics metrics;
  metrics.arrivals[0] = {"a\"}\nfake 1\\", 0, 1, 0, 0, 0};
  const std::string text = render_node_metrics(metrics);
  EXPECT_NE(text.find(R"(node="a\"}\nfake 1\\")"), std::string::npos) << text;
  EXPECT_EQ(text.find("\nfake 1"), std::string::npos) << text;
}

}  // namespace
}  // namespace mcprun
