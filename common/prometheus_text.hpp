// Prometheus' text exposition format (0.0.4): the one writer behind both metrics endpoints,
// rendezvousd's and the launcher's. Debian 12 has no prometheus-cpp.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>

namespace mcprun {

/// An exposition, family by family: family() once, then its samples.
class PrometheusText {
 public:
  /// `# HELP` and `# TYPE` of a metric family; the help text escaped as the format asks.
  void family(std::string_view name, std::string_view type, std::string_view help);

  /// One sample: `name{labels} value`, or `name value` without labels. `labels` is what
  /// label_set() makes.
  template <typename Value>
  void sample(std::string_view name, std::string_view labels, Value value) {
    if (labels.empty())
      fmt::format_to(std::back_inserter(text_), "{} {}\n", name, value);
    else
      fmt::format_to(std::back_inserter(text_), "{}{{{}}} {}\n", name, labels, value);
  }

  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

/// `key="value",...`, each value escaped (a host name comes from a rank's own records).
std::string label_set(std::initializer_list<std::pair<std::string_view, std::string_view>> labels);

/// This process's resident memory (/proc/self/statm), for `process_resident_memory_bytes`; 0
/// when it cannot be read.
uint64_t resident_memory_bytes();

}  // namespace mcprun
