#include "common/prometheus_text.hpp"

#include <gtest/gtest.h>

namespace mcprun {
namespace {

TEST(PrometheusText, FamilyThenSamplesWithAndWithoutLabels) {
  PrometheusText out;
  out.family("mcprun_jobs", "gauge", "Jobs, by state.");
  out.sample("mcprun_jobs", label_set({{"state", "running"}}), 2);
  out.sample("mcprun_nodes", "", 0.25);
  EXPECT_EQ(out.text(),
            "# HELP mcprun_jobs Jobs, by state.\n# TYPE mcprun_jobs gauge\n"
            "mcprun_jobs{state=\"running\"} 2\nmcprun_nodes 0.25\n");
}

TEST(PrometheusText, LabelValuesEscapeBackslashQuoteAndNewline) {
  // A host name is whatever a rank's records say: it must not end the label or the line.
  EXPECT_EQ(label_set({{"rank", "3"}, {"node", "a\\b\"c\nd"}}),
            "rank=\"3\",node=\"a\\\\b\\\"c\\nd\"");
}

TEST(PrometheusText, HelpEscapesBackslashAndNewlineButNotQuotes) {
  PrometheusText out;
  out.family("m", "counter", "say \"hi\"\\\nnow");
  EXPECT_EQ(out.text(), "# HELP m say \"hi\"\\\\\\nnow\n# TYPE m counter\n");
}

TEST(PrometheusText, ResidentMemoryIsReadFromProc) {
  EXPECT_GT(resident_memory_bytes(), 1024u * 1024u);
}

}  // namespace
}  // namespace mcprun
