// Launch's messages to and from the other nodes during an attempt: a failure or stall here is
// told to every node at once, and theirs stop this node's group; stall reports, straggler lines
// and helper-barrier arrivals travel the same way. The rest of Launch is in launch.cpp.
#include <fmt/format.h>

#include "common/logging.hpp"
#include "common/protocol.hpp"
#include "launcher/launch.hpp"
#include "launcher/watch/stall_report.hpp"

namespace mcprun {
namespace {

/// A stall notice's share of its rendezvous frame; the rest is room for the type and the node
/// name the daemon adds when it relays it.
constexpr size_t kStallNoticeBytes = kMaxFrameBytes - 4096;

}  // namespace

void Launch::tell_other_nodes_of_failures_and_stalls() {
  if (config_.uses_rendezvous()) {
    group_->on_first_failure([this](const WorkerOutcome& worker) {
      if (in_preflight_) return;
      rendezvous_->report_failure("rank " + std::to_string(worker.rank) + " on " + host_ +
                                      " failed with " +
                                      describe_exit(worker.exit_code, worker.signal),
                                  exit_code_for(worker));
    });
  }
  // A stall: this node's ranks are diagnosed before their stacks are dumped, and every other
  // node hears of them at once, so each node's report covers the whole job.
  group_->on_stall([this](const StallNotice& notice, const std::vector<WorkerStatus>& workers) {
    std::vector<RankProgress> local = watch_->diagnose(notice, workers);
    add_stall_hints(node_facts(), workers, local);
    if (rendezvous_) {
      StallReportMessage report;
      for (const RankProgress& rank : local) report.ranks.push_back(to_json(rank));
      rendezvous_->send(report);
    }
    summary_.stall_ranks.insert(summary_.stall_ranks.end(), local.begin(), local.end());
  });
}

PeerEvents Launch::peer_events() {
  PeerEvents events;
  events.on_stop = [this](const PeerStop& stop) {
    membership_change_ = stop.membership_change;
    if (in_preflight_) peer_preflight_verdict_ = stop.preflight;
    group_->request_stop(stop.reason, stop.exit_code);
  };
  events.on_stall = [this](const nlohmann::json& message) {
    try {
      group_->request_stall(stall_notice_from_json(message));
    } catch (const std::exception& bad) {
      spdlog::error("node {} sent a malformed stall notice ({}); stopping as stalled anyway",
                    message.value("node", std::string("?")), bad.what());
      StallNotice unknown;
      unknown.what = "a stall on node " + message.value("node", std::string("?"));
      group_->request_stall(unknown);
    }
  };
  // Only the store's host watches the records; every node's console names the straggler.
  events.on_straggler = [this](const std::string& line) {
    spdlog::warn("{}", printable_text(line));
    if (line.starts_with("slow collective:"))
      watch_->check_links();  // Is this node's link the slow one?
  };
  events.on_stall_report = [this](const std::string& node, const nlohmann::json& ranks) {
    reported_nodes_.insert(node.empty() ? "?" : node);
    try {
      for (const auto& rank : ranks) summary_.stall_ranks.push_back(rank_progress_from_json(rank));
    } catch (const std::exception& bad) {
      spdlog::warn("node {} sent a malformed stall report: {}", node, bad.what());
    }
  };
  events.on_barrier_done = [this](const std::string& name) { watch_->complete_barrier(name); };
  return events;
}

StallHooks Launch::stall_hooks() {
  StallHooks hooks;
  hooks.on_stall = [this](const StallNotice& notice) {
    spdlog::error("stall: {}", notice.what);
    // Every rank's reporter, on every node, hears it through the store and dumps its recorder.
    if (notice.kind == StallNotice::Kind::kCollective && store_)
      store_->set(kFlightRecorderDumpKey, "1");
    if (notice.collective)
      draw_collectives("stall", notice.what,
                       {notice.collective->missing.begin(), notice.collective->missing.end()});
    if (rendezvous_) {
      rendezvous_->send(StallMessage{to_frame_json(notice, kStallNoticeBytes), notice.what});
    }
    group_->request_stall(notice);
  };
  hooks.workers = [this] { return group_->status(); };
  if (rendezvous_) {
    hooks.forward_barrier_arrival = [this](const std::string& name, int rank) {
      rendezvous_->send(BarrierArrival{name, rank});
    };
  }
  hooks.on_straggler_line = [this](const std::string& line) {
    if (rendezvous_) rendezvous_->send(StragglerMessage{"", line});
    draw_collectives("straggler", line, {});
  };
  return hooks;
}

}  // namespace mcprun
