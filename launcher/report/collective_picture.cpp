#include "launcher/report/collective_picture.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/logging.hpp"

namespace mcprun {
namespace {

constexpr int kLabelWidth = 220, kPlotWidth = 960, kRowHeight = 22, kTop = 30, kBottom = 40;
constexpr int kChartHeight = 180;  ///< The lag and pace charts' plot height.
constexpr int kTicks = 4;          ///< Time axis: a label at each quarter.
/// A rank's lag is drawn as its mean over this many collectives: a step's several collectives
/// (only the first of which a slow rank is late for) read as one figure.
constexpr size_t kLagSmoothing = 8;

/// Text as HTML and SVG take it: host names come from the ranks' own records.
std::string escaped(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '"')
      out += "&quot;";
    else if (static_cast<unsigned char>(c) < 0x20)
      out += ' ';
    else
      out += c;
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

/// Seconds the others waited for each rank: at each collective, the mean of their waits for its
/// last arrival is charged to that rank.
std::map<int, double> waits_charged(const std::deque<SeenCollective>& recent) {
  std::map<int, double> charged;
  for (const SeenCollective& collective : recent) {
    if (collective.arrivals.size() < 2) continue;
    const auto latest =
        std::max_element(collective.arrivals.begin(), collective.arrivals.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    double waited_ns = 0;
    for (const auto& [rank, created] : collective.arrivals)
      waited_ns += static_cast<double>(latest->second - created);
    charged[latest->first] += waited_ns / static_cast<double>(collective.arrivals.size() - 1) / 1e9;
  }
  return charged;
}

/// The group most of the collectives ran on: the default group under DDP.
std::string main_group(const std::deque<SeenCollective>& recent) {
  std::map<std::string, int> counts;
  for (const SeenCollective& collective : recent) ++counts[collective.group];
  const auto most =
      std::max_element(counts.begin(), counts.end(),
                       [](const auto& a, const auto& b) { return a.second < b.second; });
  return most == counts.end() ? std::string() : most->first;
}

std::string row_label(int rank, const std::map<int, RankArrivals>& ranks) {
  std::string label = fmt::format("rank {}", rank);
  if (auto info = ranks.find(rank); info != ranks.end() && !info->second.host.empty())
    label += fmt::format(" ({}, local {})", info->second.host, info->second.local_rank);
  return label;
}

void time_axis(std::string& out, int y, const std::vector<std::string>& ticks);

/// One chart of values over the collectives, one column each: `draw` gets the SVG and the
/// value-to-y mapping; `ticks` label the axis at each quarter.
template <typename Draw>
void chart(std::string& out, const char* name, int width, double max_value, const char* unit,
           const std::vector<std::string>& ticks, Draw draw) {
  const int height = 10 + kChartHeight + 30;
  const int bottom = 10 + kChartHeight;
  const double top_value = max_value > 0 ? max_value : 1;
  put(out,
      "<svg class=\"{0}\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{1}\" height=\"{2}\" "
      "viewBox=\"0 0 {1} {2}\">\n",
      name, width, height);
  put(out, "<text class=\"label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0f} {}</text>\n",
      kLabelWidth - 6, 20, top_value, unit);
  put(out, "<text class=\"label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>\n",
      kLabelWidth - 6, bottom);
  time_axis(out, bottom, ticks);
  draw(out, [&](double value) { return bottom - value / top_value * kChartHeight; });
  put(out, "</svg>\n");
}

/// The time axis under a chart that starts at `y`: 0 s, each quarter, the span.
void time_axis(std::string& out, int y, const std::vector<std::string>& ticks) {
  for (size_t tick = 0; tick < ticks.size(); ++tick) {
    const double x = kLabelWidth + kPlotWidth * static_cast<double>(tick) / kTicks;
    put(out, "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#cfd8dc\"/>\n", x,
        y - kChartHeight, y);
    put(out, "<text class=\"label\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x,
        y + 16, ticks[tick]);
  }
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
    return kLabelWidth + (last > first
                              ? static_cast<double>(ns - first) / static_cast<double>(last - first)
                              : 0.5) *
                             kPlotWidth;
  };
  std::map<int, size_t> row_of;
  for (size_t i = 0; i < rows.size(); ++i) row_of[rows[i]] = i;
  const int height = kTop + static_cast<int>(rows.size()) * kRowHeight + kBottom;
  const int width = kLabelWidth + kPlotWidth + 20;

  std::string out;
  put(out,
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>"
      "<title>mcprun: {}</title><style>body{{font-family:sans-serif;margin:16px}}"
      "p{{max-width:1200px}} .label{{font-size:12px}}</style></head><body>\n",
      escaped(marks.title));
  put(out, "<h1>mcprun: {}</h1>\n<p>{}</p>\n", escaped(marks.title), escaped(marks.note));
  put(out,
      "<p>The last {} collectives every member arrived at, over {:.2f} s, on the clock of the node "
      "that serves the job store.</p>\n",
      recent.size(), span_s);
  const int chart_width = kLabelWidth + kPlotWidth + 20;

  // Who: the time the others waited for each rank.
  const std::map<int, double> charged = waits_charged(recent);
  double most_s = 0, total_s = 0;
  for (const auto& [rank, seconds] : charged) {
    most_s = std::max(most_s, seconds);
    total_s += seconds;
  }
  put(out,
      "<h2>Who the others waited for</h2>\n<p>At each collective the others' mean wait for its "
      "last arrival is charged to that rank: {:.2f} s in all.</p>\n",
      total_s);
  const int bars_height = static_cast<int>(rows.size()) * kRowHeight + 10;
  put(out,
      "<svg class=\"waits\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\">\n",
      chart_width, bars_height);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int rank = rows[i];
    const int y = static_cast<int>(i) * kRowHeight;
    const auto it = charged.find(rank);
    const double seconds = it == charged.end() ? 0 : it->second;
    const double length = most_s > 0 ? seconds / most_s * (kPlotWidth - 160) : 0;
    put(out, "<text class=\"label\" x=\"6\" y=\"{}\">{}</text>\n", y + 15,
        escaped(row_label(rank, ranks)));
    put(out,
        "<rect class=\"wait\" data-rank=\"{}\" x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" "
        "fill=\"{}\"/>\n",
        rank, kLabelWidth, y + 4, length, kRowHeight - 8,
        marks.straggler == rank ? "#d32f2f" : "#90a4ae");
    put(out, "<text class=\"label\" x=\"{:.1f}\" y=\"{}\">{:.2f} s ({:.0f}%)</text>\n",
        kLabelWidth + length + 6, y + 15, seconds, total_s > 0 ? 100 * seconds / total_s : 0);
  }
  put(out, "</svg>\n");

  // The lag and pace charts give each collective a column: the reporters send arrivals in blocks,
  // and on a time axis the gaps between blocks would crowd the collectives into a few blobs.
  std::vector<int64_t> earliest_of;
  for (const SeenCollective& collective : recent) {
    int64_t earliest = std::numeric_limits<int64_t>::max();
    for (const auto& [rank, created] : collective.arrivals) earliest = std::min(earliest, created);
    earliest_of.push_back(collective.arrivals.empty() ? first : earliest);
  }
  auto column_x = [&](size_t index) {
    return kLabelWidth + (static_cast<double>(index) + 0.5) /
                             static_cast<double>(std::max<size_t>(recent.size(), 1)) * kPlotWidth;
  };
  std::vector<std::string> ticks;  // Each quarter's collective, by when it began.
  for (int tick = 0; tick <= kTicks && !recent.empty(); ++tick) {
    const auto index =
        static_cast<size_t>(std::lround(static_cast<double>(recent.size() - 1) * tick / kTicks));
    ticks.push_back(fmt::format("{:.1f} s", static_cast<double>(earliest_of[index] - first) / 1e9));
  }

  // How much: each rank's lag behind each collective's first arrival, over the window.
  double lag_max_ms = 0;
  std::map<int, std::vector<std::pair<double, double>>> lags;  // Rank -> (x, mean lag ms).
  std::map<int, std::deque<double>> last_lags;
  for (size_t index = 0; index < recent.size(); ++index) {
    for (const auto& [rank, created] : recent[index].arrivals) {
      if (std::find(rows.begin(), rows.end(), rank) == rows.end()) continue;
      std::deque<double>& its = last_lags[rank];
      its.push_back(static_cast<double>(created - earliest_of[index]) / 1e6);
      if (its.size() > kLagSmoothing) its.pop_front();
      double sum = 0;
      for (double lag_ms : its) sum += lag_ms;
      const double mean_ms = sum / static_cast<double>(its.size());
      lag_max_ms = std::max(lag_max_ms, mean_ms);
      lags[rank].emplace_back(column_x(index), mean_ms);
    }
  }
  put(out,
      "<h2>Each rank's lag</h2>\n<p>How long after each collective's first arrival each rank "
      "arrived, as its mean over {} collectives{}.</p>\n",
      kLagSmoothing, marks.straggler ? fmt::format("; rank {} in red", *marks.straggler) : "");
  chart(out, "lags", chart_width, lag_max_ms, "ms", ticks, [&](std::string& svg, auto y_of) {
    for (const auto& [rank, points] : lags) {
      std::string polyline;
      for (const auto& [x, lag_ms] : points)
        polyline += fmt::format("{:.1f},{:.1f} ", x, y_of(lag_ms));
      const bool straggler = marks.straggler == rank;
      put(svg,
          "<polyline class=\"lag\" data-rank=\"{}\" points=\"{}\" fill=\"none\" stroke=\"{}\" "
          "stroke-width=\"{}\"/>\n",
          rank, polyline, straggler ? "#d32f2f" : "#90a4ae", straggler ? 2 : 1);
    }
  });

  // Since when: the pace of the main group's collectives, with those the straggler held back.
  const std::string group = main_group(recent);
  std::vector<std::tuple<double, double, bool>>
      pace;  // (x, ms since the previous, straggler last).
  double pace_max_ms = 0;
  std::optional<std::pair<int64_t, int64_t>> previous;  // Its sequence number and last arrival.
  for (size_t index = 0; index < recent.size(); ++index) {
    const SeenCollective& collective = recent[index];
    if (collective.group != group || collective.arrivals.empty()) continue;
    const auto latest =
        std::max_element(collective.arrivals.begin(), collective.arrivals.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    // Between consecutive ones only: a block's first follows a gap the reporters left.
    if (previous && previous->first + 1 == collective.seq) {
      const double gap_ms = static_cast<double>(latest->second - previous->second) / 1e6;
      pace_max_ms = std::max(pace_max_ms, gap_ms);
      pace.emplace_back(column_x(index), gap_ms, marks.straggler == latest->first);
    }
    previous.emplace(collective.seq, latest->second);
  }
  put(out,
      "<h2>The pace</h2>\n<p>Group {}: the time from one collective's last arrival to the "
      "next's; red where {} arrived last.</p>\n",
      escaped(group),
      marks.straggler ? fmt::format("rank {}", *marks.straggler) : std::string("the straggler"));
  chart(out, "pace", chart_width, pace_max_ms, "ms", ticks, [&](std::string& svg, auto y_of) {
    for (const auto& [x, gap_ms, held_back] : pace)
      put(svg, "<circle class=\"{}\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" fill=\"{}\"/>\n",
          held_back ? "held" : "collective", x, y_of(gap_ms), held_back ? 3 : 2,
          held_back ? "#d32f2f" : "#607d8b");
  });

  put(out,
      "<h2>Every arrival</h2>\n<p>One row per rank; a mark at each arrival; the last arrival "
      "of each collective in red.</p>\n");
  put(out,
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} "
      "{}\">\n",
      width, height, width, height);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int rank = rows[i];
    const int y = kTop + static_cast<int>(i) * kRowHeight;
    const bool straggler = marks.straggler == rank, missing = marks.missing.contains(rank);
    const char* fill = straggler ? "#ffe0b2" : missing ? "#ffcdd2" : i % 2 ? "#f5f5f5" : "#ffffff";
    put(out,
        "<rect class=\"row\" data-rank=\"{}\" x=\"0\" y=\"{}\" width=\"{}\" height=\"{}\" "
        "fill=\"{}\"/>\n",
        rank, y, width, kRowHeight, fill);
    std::string label = row_label(rank, ranks);
    if (straggler) label += ": straggler";
    if (missing) label += ": missing";
    put(out, "<text class=\"label\" x=\"6\" y=\"{}\">{}</text>\n", y + 15, escaped(label));
  }
  for (const SeenCollective& collective : recent) {
    const auto latest =
        std::max_element(collective.arrivals.begin(), collective.arrivals.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    for (auto it = collective.arrivals.begin(); it != collective.arrivals.end(); ++it) {
      auto row = row_of.find(it->first);
      if (row == row_of.end()) continue;
      const bool is_last = it == latest;
      put(out, "<rect class=\"{}\" x=\"{:.1f}\" y=\"{}\" width=\"2\" height=\"{}\" fill=\"{}\"/>\n",
          is_last ? "last" : "arrival", x_of(it->second),
          kTop + static_cast<int>(row->second) * kRowHeight + 4, kRowHeight - 8,
          is_last ? "#d32f2f" : "#607d8b");
    }
  }
  const int axis_y = kTop + static_cast<int>(rows.size()) * kRowHeight;
  for (int tick = 0; tick <= kTicks; ++tick)
    put(out, "<text class=\"label\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:.1f} s</text>\n",
        kLabelWidth + kPlotWidth * tick / static_cast<double>(kTicks), axis_y + 16,
        span_s * tick / kTicks);
  put(out, "</svg>\n</body></html>\n");
  return out;
}

bool draw_collective_picture(const StragglerWatch* stragglers, const std::filesystem::path& path,
                             PictureMarks marks) {
  if (!stragglers || stragglers->recent().empty()) return false;
  if (const StragglerEpisode* current = stragglers->current()) marks.straggler = current->rank;
  std::ofstream out(path);
  out << render_collective_picture(stragglers->recent(), stragglers->arrivals(), marks);
  if (!out.flush()) {
    spdlog::warn("cannot write the picture of the last collectives to {}", path.string());
    return false;
  }
  spdlog::info("the last collectives, drawn: {}", path.string());
  return true;
}

}  // namespace mcprun
