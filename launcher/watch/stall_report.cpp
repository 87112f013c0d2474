#include "launcher/watch/stall_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "common/topology.hpp"

namespace mcprun {
namespace {

/// The state column's width; a longer state puts the last output on the next line.
constexpr size_t kStateColumn = 38;

constexpr const char* kKindNames[] = {"init",      "barrier", "timer",
                                      "heartbeat", "silence", "collective"};

/// "0-3,5": ranks as a compact list.
std::string rank_list(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  return ranks.empty() ? "none" : format_cpulist(ranks);
}

/// The collective stall's own lines: the call, who is in it, who is not, and what to try.
std::string collective_summary(const CollectiveStall& stall) {
  std::string text = fmt::format("\n  collective: {}, pending {:.0f} s; in it: {}; not in it: {}",
                                 describe(stall.collective), stall.collective.pending_s,
                                 rank_list(stall.in), rank_list(stall.missing));
  if (stall.mismatch)
    text += "\n  MISMATCH: ranks called different collectives (see each rank's state below)";
  if (stall.missing.empty())
    text +=
        "\n  every member is in it and it never completes: on GPUs, NCCL's communicator or "
        "transport (the wrong interface: NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME; broken P2P: "
        "NCCL_P2P_DISABLE=1; a small /dev/shm). Run `mcprun doctor` on each node";
  if (stall.source == "stack")
    text +=
        "\n  (torch 1.x has no Flight Recorder: collectives are seen in Python stacks, and "
        "one that DDP issues from C++ shows as the caller's frame, such as backward())";
  return text;
}

}  // namespace

nlohmann::json to_json(const StallNotice& notice) {
  nlohmann::json json{{"kind", kKindNames[static_cast<int>(notice.kind)]},
                      {"what", notice.what},
                      {"noticed_on", notice.noticed_on}};
  if (!notice.barrier.empty()) json["barrier"] = notice.barrier;
  if (notice.rank) json["rank"] = *notice.rank;
  if (!notice.arrived.empty()) json["arrived"] = notice.arrived;
  if (notice.collective) json["collective"] = to_json(*notice.collective);
  return json;
}

nlohmann::json to_frame_json(const StallNotice& notice, size_t max_bytes) {
  StallNotice rest = notice;
  rest.collective.reset();
  rest.arrived.clear();
  nlohmann::json json = to_json(rest);
  if (!notice.arrived.empty()) {
    // Each host's ports as ranges, hosts in order while they fit half the frame; the rest are
    // counted, and their nodes say that they cannot tell.
    nlohmann::json arrived = nlohmann::json::object();
    size_t used = json.dump().size(), left_out = notice.arrived_left_out;
    for (const auto& [host, ports] : notice.arrived) {
      std::vector<int> sorted = ports;
      std::sort(sorted.begin(), sorted.end());
      std::string list = format_cpulist(sorted);
      const size_t size = host.size() + list.size() + 8;
      if (used + size > max_bytes / 2) {
        ++left_out;
        continue;
      }
      used += size;
      arrived[host] = std::move(list);
    }
    json["arrived"] = std::move(arrived);
    if (left_out) json["arrived_left_out"] = left_out;
  }
  if (notice.collective) {
    const size_t used = json.dump().size();
    json["collective"] =
        to_compact_json(*notice.collective, max_bytes > used ? max_bytes - used : 0);
  }
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
  if (json.contains("arrived")) {
    for (const auto& [host, ports] : json.at("arrived").items()) {
      if (!ports.is_string()) {
        notice.arrived[host] = ports.get<std::vector<int>>();
        continue;
      }
      auto parsed = parse_cpulist(ports.get<std::string>());
      if (!parsed) throw std::invalid_argument("malformed ports of " + host);
      notice.arrived[host] = std::move(*parsed);
    }
  }
  notice.arrived_left_out = json.value("arrived_left_out", size_t{0});
  if (json.contains("collective"))
    notice.collective = collective_stall_from_json(json.at("collective"));
  return notice;
}

nlohmann::json to_json(const RankProgress& progress) {
  return {{"rank", progress.rank},
          {"local_rank", progress.local_rank},
          {"host", progress.host},
          {"pid", progress.pid},
          {"level", progress.level},
          {"state", progress.state},
          {"last_line", progress.last_line},
          {"last_line_age_s", progress.last_line_age_s},
          {"stack_file", progress.stack_file},
          {"hint", progress.hint}};
}

RankProgress rank_progress_from_json(const nlohmann::json& json) {
  return {json.at("rank"),       json.at("local_rank"),
          json.at("host"),       json.at("pid"),
          json.at("level"),      json.at("state"),
          json.at("last_line"),  json.at("last_line_age_s"),
          json.at("stack_file"), json.value("hint", std::string())};
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
  for (const RankProgress& rank : ranks)
    (rank.level < furthest ? missing : arrived).push_back(rank.rank);
  const int unreported = world_size - static_cast<int>(ranks.size());

  const std::string rule(72, '=');
  std::ostringstream out;
  out << rule << "\nmcprun: job STALLED: " << notice.what;
  if (!notice.noticed_on.empty()) out << " (noticed on " << notice.noticed_on << ")";
  out << "\n  arrived: " << arrived.size() << " of " << world_size << " ranks ("
      << rank_list(arrived) << ")\n  missing: " << rank_list(missing);
  if (unreported > 0) out << "; " << unreported << " rank(s) on nodes that sent no report";
  if (notice.collective) out << collective_summary(*notice.collective);
  out << "\n" << std::string(72, '-') << "\n";
  out << fmt::format("  {:<5} {:<24} {:<8} {:<38} {}\n", "rank", "host:local", "pid", "state",
                     "last output");
  for (const RankProgress& rank : ranks) {
    std::string last = "(no output)";
    if (rank.last_line_age_s >= 0)
      last = fmt::format("{:.1f} s ago: {}", rank.last_line_age_s, rank.last_line.substr(0, 120));
    const std::string row = fmt::format(
        "  {:<5} {:<24} {:<8} ", std::to_string(rank.rank) + (rank.level < furthest ? "*" : ""),
        rank.host + ":" + std::to_string(rank.local_rank),
        rank.pid > 0 ? std::to_string(rank.pid) : "-");
    if (rank.state.size() <= kStateColumn)
      out << row << fmt::format("{:<{}} {}\n", rank.state, kStateColumn, last);
    else  // A collective stall's state names frames: the last output goes on a line of its own.
      out << row << rank.state << "\n"
          << std::string(row.size(), ' ') << "last output " << last << "\n";
    if (!rank.hint.empty()) out << std::string(8, ' ') << "hint: " << rank.hint << "\n";
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
