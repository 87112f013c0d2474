#include "launcher/stall/stall_report.hpp"

#include "common/topology.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace mcprun {
namespace {

constexpr const char* kKindNames[] = {"init", "barrier", "timer", "heartbeat", "silence"};

/// "0-3,5": ranks as a compact list.
std::string rank_list(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  return ranks.empty() ? "none" : format_cpulist(ranks);
}

}  // namespace

nlohmann::json to_json(const StallNotice& notice) {
  nlohmann::json json{{"kind", kKindNames[static_cast<int>(notice.kind)]},
                      {"what", notice.what},
                      {"noticed_on", notice.noticed_on}};
  if (!notice.barrier.empty()) json["barrier"] = notice.barrier;
  if (notice.rank) json["rank"] = *notice.rank;
  if (!notice.arrived.empty()) json["arrived"] = notice.arrived;
  return json;
}

StallNotice stall_notice_from_json(const nlohmann::json& json) {
  StallNotice notice;
  const std::string kind = json.at("kind").get<std::string>();
  auto name = std::find(std::begin(kKindNames), std::end(kKindNames), kind);
  if (name == std::end(kKindNames)) throw std::invalid_argument("unknown stall kind " + kind);
  notice.kind = static_cast<StallNotice::Kind>(name - std::begin(kKindNames));
  notice.what = json.at("what").get<std::string>();
  notice.noticed_on = json.value("noticed_on", std::string());
  notice.barrier = json.value("barrier", std::string());
  if (json.contains("rank")) notice.rank = json.at("rank").get<int>();
  notice.arrived = json.value("arrived", PeerPorts{});
  return notice;
}

nlohmann::json to_json(const RankProgress& progress) {
  return {{"rank", progress.rank},           {"local_rank", progress.local_rank},
          {"host", progress.host},           {"pid", progress.pid},
          {"level", progress.level},         {"state", progress.state},
          {"last_line", progress.last_line}, {"last_line_age_s", progress.last_line_age_s},
          {"stack_file", progress.stack_file}};
}

RankProgress rank_progress_from_json(const nlohmann::json& json) {
  return {json.at("rank"),      json.at("local_rank"), json.at("host"),
          json.at("pid"),       json.at("level"),      json.at("state"),
          json.at("last_line"), json.at("last_line_age_s"), json.at("stack_file")};
}

int furthest_level(const std::vector<RankProgress>& ranks) {
  int furthest = RankProgress::kNotRunning;
  for (const RankProgress& rank : ranks) furthest = std::max(furthest, rank.level);
  return furthest;
}

std::string format_stall_report(const StallNotice& notice, std::vector<RankProgress> ranks,
                                int world_size) {
  std::sort(ranks.begin(), ranks.end(),
            [](const RankProgress& a, const RankProgress& b) { return a.rank < b.rank; });
  const int furthest = furthest_level(ranks);
  std::vector<int> arrived, missing;
  for (const RankProgress& rank : ranks) (rank.level < furthest ? missing : arrived).push_back(rank.rank);
  const int unreported = world_size - static_cast<int>(ranks.size());

  const std::string rule(72, '=');
  std::ostringstream out;
  out << rule << "\nmcprun: job STALLED: " << notice.what;
  if (!notice.noticed_on.empty()) out << " (noticed on " << notice.noticed_on << ")";
  out << "\n  arrived: " << arrived.size() << " of " << world_size << " ranks (" << rank_list(arrived)
      << ")\n  missing: " << rank_list(missing);
  if (unreported > 0) out << "; " << unreported << " rank(s) on nodes that sent no report";
  out << "\n" << std::string(72, '-') << "\n";
  out << fmt::format("  {:<5} {:<24} {:<8} {:<38} {}\n", "rank", "host:local", "pid", "state",
                     "last output");
  for (const RankProgress& rank : ranks) {
    std::string last = "(no output)";
    if (rank.last_line_age_s >= 0)
      last = fmt::format("{:.1f} s ago: {}", rank.last_line_age_s,
                         rank.last_line.substr(0, 120));
    out << fmt::format("  {:<5} {:<24} {:<8} {:<38} {}\n",
                       std::to_string(rank.rank) + (rank.level < furthest ? "*" : ""),
                       rank.host + ":" + std::to_string(rank.local_rank),
                       rank.pid > 0 ? std::to_string(rank.pid) : "-", rank.state, last);
  }
  bool any_dump = false;
  for (const RankProgress& rank : ranks) any_dump |= !rank.stack_file.empty();
  if (any_dump) {
    out << "Stack dumps:\n";
    for (const RankProgress& rank : ranks)
      if (!rank.stack_file.empty())
        out << "  rank " << rank.rank << ": " << rank.host << ":" << rank.stack_file << "\n";
  }
  out << "(* = a rank the others were waiting for)\n" << rule << "\n";
  return out.str();
}

}  // namespace mcprun
