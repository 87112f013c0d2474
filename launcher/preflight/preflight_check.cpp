#include "launcher/preflight/preflight_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "common/protocol.hpp"

namespace mcprun {

namespace {

/// Starting the interpreters and importing torch: 2-8 s measured on a loaded 2-core box.
constexpr double kStartS = 30;
/// A round of pair exchanges takes a quarter of a step's deadline, and never under this: a
/// two-rank process group on a loaded box connects in well under a second.
constexpr double kMinRoundS = 2;
/// The check's own grace between steps (worker_helper/mcprun/_preflight.py's LIVENESS_GRACE_S).
constexpr double kGraceS = 2;

nlohmann::json failed_report(const std::string& verdict) {
  return {{"ok", false},
          {"verdict", verdict},
          {"faults", nlohmann::json::array()},
          {"text", "mcprun preflight: " + verdict + "\n"}};
}

}  // namespace

PreflightBudget preflight_budget(double step_s, int world_size) {
  PreflightBudget budget;
  budget.step_s = step_s;
  budget.round_s = std::max(kMinRoundS, step_s / 4);
  budget.rounds = world_size < 2 ? 0 : world_size % 2 ? world_size : world_size - 1;
  // Start, init, all-reduce, the liveness after a failed step, the rounds, the results' gathering
  // and the report.
  budget.bound_s = std::ceil(kStartS + 3 * step_s + kGraceS + budget.rounds * budget.round_s +
                             budget.round_s + 2 * kGraceS);
  return budget;
}

Environment preflight_env(const PreflightBudget& budget, const PreflightPass& pass) {
  const double end_s = std::chrono::duration<double>(pass.end.time_since_epoch()).count();
  return {{"MCPRUN_PREFLIGHT_REPORT", pass.report_file.string()},
          {"MCPRUN_PREFLIGHT_NODE", pass.node_file.string()},
          {"MCPRUN_PREFLIGHT_PASS", std::to_string(pass.number)},
          {"MCPRUN_PREFLIGHT_TIMEOUT", fmt::format("{}", budget.step_s)},
          {"MCPRUN_PREFLIGHT_ROUND_TIMEOUT", fmt::format("{}", budget.round_s)},
          // steady_clock is CLOCK_MONOTONIC, Python's time.monotonic(): one clock per node.
          {"MCPRUN_PREFLIGHT_END", fmt::format("{:.3f}", end_s)},
          {"MCPRUN_PREFLIGHT_MIN_BUSBW", fmt::format("{}", pass.min_busbw_gbps)},
          {"MCPRUN_COLLECTIVE_WATCH", "0"}};  // The check's groups are no job's.
}

nlohmann::json preflight_node(const RankPlan& plan, const std::string& node) {
  nlohmann::json gpus = nlohmann::json::object();
  for (const RankSlot& slot : plan.slots)
    if (const auto& gpu = slot.identity.gpu)
      gpus[std::to_string(slot.identity.local_rank)] = {
          {"bus_id", gpu->bus_id},         {"numa_node", gpu->numa_node},
          {"link_width", gpu->link_width}, {"max_link_width", gpu->max_link_width},
          {"link_speed", gpu->link_speed}, {"max_link_speed", gpu->max_link_speed}};
  return {{"node", node}, {"gpus", gpus}};
}

nlohmann::json read_preflight_report(const std::filesystem::path& file) {
  std::ifstream in(file);
  nlohmann::json report = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (in && report.is_object() && report.contains("ok")) return report;
  return failed_report("FAIL: the check left no report (" + file.string() +
                       "): see its ranks' output above");
}

nlohmann::json overran_preflight_report(const PreflightBudget& budget) {
  nlohmann::json report = failed_report(fmt::format(
      "FAIL: the check ran past its bound of {:g} s and was stopped: a rank that never started, "
      "or a step that would not end; see its ranks' output above",
      budget.bound_s));
  report["faults"].push_back({{"kind", "dead"}, {"what", "step"}, {"name", "bound"}});
  return report;
}

nlohmann::json verdict_for_peers(const nlohmann::json& report, const std::string& node) {
  // A quarter of a frame: the notice's other fields and its JSON escaping stay well within it.
  constexpr size_t kBudgetBytes = kMaxFrameBytes / 4;
  nlohmann::json verdict = {{"judged_on", node}};
  for (const char* key : {"ok", "dead", "backend", "world_size", "verdict"})
    if (report.contains(key)) verdict[key] = report[key];
  if (verdict.value("verdict", std::string()).size() > kBudgetBytes / 4)
    verdict["verdict"] = verdict["verdict"].get<std::string>().substr(0, kBudgetBytes / 4) + "...";
  const std::string text = report.value("text", std::string());
  verdict["text"] = text.size() <= kBudgetBytes / 2
                        ? text
                        : fmt::format(
                              "mcprun preflight: {}\n(the full report is in node {}'s "
                              "summary.json)\n",
                              verdict.value("verdict", std::string("FAIL")), node);
  verdict["faults"] = nlohmann::json::array();
  size_t bytes = verdict.dump().size();
  for (const auto& fault : report.value("faults", nlohmann::json::array())) {
    bytes += fault.dump().size() + 1;  // The comma.
    if (bytes > kBudgetBytes) break;
    verdict["faults"].push_back(fault);
  }
  return verdict;
}

std::optional<std::pair<int64_t, double>> preflight_floor(const nlohmann::json& report) {
  const auto bytes = report.find("floor_bytes"), busbw = report.find("floor_busbw");
  if (bytes == report.end() || busbw == report.end() || !bytes->is_number_integer() ||
      !busbw->is_number() || bytes->get<int64_t>() <= 0 || busbw->get<double>() <= 0)
    return std::nullopt;
  return std::pair{bytes->get<int64_t>(), busbw->get<double>()};
}

std::string nccl_transport_finding(const nlohmann::json& retries) {
  if (retries.value("NCCL_P2P_DISABLE", false))
    return "it passes with NCCL_P2P_DISABLE=1: GPU peer-to-peer fails on this box; check the "
           "IOMMU/ACS settings and the PCIe switch, and run with NCCL_P2P_DISABLE=1 meanwhile";
  if (retries.value("NCCL_SHM_DISABLE", false))
    return "it passes with NCCL_SHM_DISABLE=1: NCCL's shared-memory transport fails; check "
           "/dev/shm (mcprun doctor; docker's default is 64 MB)";
  return "it fails with NCCL_P2P_DISABLE=1 and with NCCL_SHM_DISABLE=1 too: not those "
         "transports, but the network or a GPU";
}

}  // namespace mcprun
