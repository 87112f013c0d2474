#include "common/prometheus_text.hpp"

#include <unistd.h>

#include <fstream>

namespace mcprun {
namespace {

/// The format's escapes: a backslash and a newline everywhere, a double quote in label values.
std::string escaped(std::string_view text, bool in_label) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '"' && in_label)
      out += "\\\"";
    else
      out += c;
  }
  return out;
}

}  // namespace

void PrometheusText::family(std::string_view name, std::string_view type, std::string_view help) {
  fmt::format_to(std::back_inserter(text_), "# HELP {} {}\n# TYPE {} {}\n", name,
                 escaped(help, false), name, type);
}

std::string label_set(std::initializer_list<std::pair<std::string_view, std::string_view>> labels) {
  std::string out;
  for (const auto& [key, value] : labels) {
    if (!out.empty()) out += ',';
    fmt::format_to(std::back_inserter(out), "{}=\"{}\"", key, escaped(value, true));
  }
  return out;
}

uint64_t resident_memory_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size_pages = 0, resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return 0;
  return resident_pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace mcprun
