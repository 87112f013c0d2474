#include "launcher/report/collective_picture.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <vector>

namespace mcprun {
namespace {

constexpr int kLabelWidth = 220, kPlotWidth = 960, kRowHeight = 22, kTop = 30, kBottom = 40;

/// Text as HTML and SVG take it: host names come from the ranks' own records.
std::string escaped(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else if (static_cast<unsigned char>(c) < 0x20) out += ' ';
    else out += c;
  }
  return out;
}

template <typename... Args>
void put(std::string& out, fmt::format_string<Args...> format, Args&&... args) {
  fmt::format_to(std::back_inserter(out), format, std::forward<Args>(args)...);
}

/// The ranks drawn, in rank order: the marked ones first in the choice, then the lowest.
std::vector<int> rows_of(const std::deque<SeenCollective>& recent, const PictureMarks& marks) {
  std::set<int> seen;
  for (const SeenCollective& collective : recent)
    for (const auto& [rank, created] : collective.arrivals) seen.insert(rank);
  for (int rank : marks.missing) seen.insert(rank);
  std::set<int> chosen(marks.missing.begin(), marks.missing.end());
  if (marks.straggler) chosen.insert(*marks.straggler);
  for (int rank : seen) {
    if (chosen.size() >= kMaxPictureRows) break;
    chosen.insert(rank);
  }
  return {chosen.begin(), chosen.end()};
}

}  // namespace

std::string render_collective_picture(const std::deque<SeenCollective>& recent,
                                      const std::map<int, RankArrivals>& ranks,
                                      const PictureMarks& marks) {
  const std::vector<int> rows = rows_of(recent, marks);
  int64_t first = std::numeric_limits<int64_t>::max(), last = std::numeric_limits<int64_t>::min();
  for (const SeenCollective& collective : recent)
    for (const auto& [rank, created] : collective.arrivals) {
      first = std::min(first, created);
      last = std::max(last, created);
    }
  const double span_s = recent.empty() ? 0 : static_cast<double>(last - first) / 1e9;
  auto x_of = [&](int64_t ns) {
    return kLabelWidth + (last > first ? static_cast<double>(ns - first) / static_cast<double>(last - first) : 0.5) * kPlotWidth;
  };
  std::map<int, size_t> row_of;
  for (size_t i = 0; i < rows.size(); ++i) row_of[rows[i]] = i;
  const int height = kTop + static_cast<int>(rows.size()) * kRowHeight + kBottom;
  const int width = kLabelWidth + kPlotWidth + 20;

  std::string out;
  put(out, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>"
      "<title>mcprun: {}</title><style>body{{font-family:sans-serif;margin:16px}}"
      "p{{max-width:1200px}} .label{{font-size:12px}}</style></head><body>\n", escaped(marks.title));
  put(out, "<h1>mcprun: {}</h1>\n<p>{}</p>\n", escaped(marks.title), escaped(marks.note));
  put(out, "<p>The last {} collectives every member arrived at, over {:.2f} s, on the clock of the node "
      "that serves the job store. One row per rank; a mark at each arrival; the last arrival of "
      "each collective in red.</p>\n", recent.size(), span_s);
  put(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\">\n",
      width, height, width, height);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int rank = rows[i];
    const int y = kTop + static_cast<int>(i) * kRowHeight;
    const bool straggler = marks.straggler == rank, missing = marks.missing.contains(rank);
    const char* fill = straggler ? "#ffe0b2" : missing ? "#ffcdd2" : i % 2 ? "#f5f5f5" : "#ffffff";
    put(out, "<rect class=\"row\" data-rank=\"{}\" x=\"0\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>\n",
        rank, y, width, kRowHeight, fill);
    std::string label = fmt::format("rank {}", rank);
    if (auto info = ranks.find(rank); info != ranks.end() && !info->second.host.empty())
      label += fmt::format(" ({}, local {})", info->second.host, info->second.local_rank);
    if (straggler) label += ": straggler";
    if (missing) label += ": missing";
    put(out, "<text class=\"label\" x=\"6\" y=\"{}\">{}</text>\n", y + 15, escaped(label));
  }
  for (const SeenCollective& collective : recent) {
    const auto latest = std::max_element(collective.arrivals.begin(), collective.arrivals.end(),
                                         [](const auto& a, const auto& b) { return a.second < b.second; });
    for (auto it = collective.arrivals.begin(); it != collective.arrivals.end(); ++it) {
      auto row = row_of.find(it->first);
      if (row == row_of.end()) continue;
      const bool is_last = it == latest;
      put(out, "<rect class=\"{}\" x=\"{:.1f}\" y=\"{}\" width=\"2\" height=\"{}\" fill=\"{}\"/>\n",
          is_last ? "last" : "arrival", x_of(it->second), kTop + static_cast<int>(row->second) * kRowHeight + 4,
          kRowHeight - 8, is_last ? "#d32f2f" : "#607d8b");
    }
  }
  const int axis_y = kTop + static_cast<int>(rows.size()) * kRowHeight + 16;
  put(out, "<text class=\"label\" x=\"{}\" y=\"{}\">0 s</text>\n", kLabelWidth, axis_y);
  put(out, "<text class=\"label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.2f} s</text>\n",
      kLabelWidth + kPlotWidth, axis_y, span_s);
  put(out, "</svg>\n</body></html>\n");
  return out;
}

}  // namespace mcprun
