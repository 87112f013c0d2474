// Stalls: what stalled (the notice every node hears), how far each rank got, and the report.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "launcher/store/init_barrier.hpp"
#include "launcher/watch/collective_watch.hpp"

namespace mcprun {

/// What stalled, as the node that noticed it tells every node of the job.
struct StallNotice {
  enum class Kind { kInit, kBarrier, kTimer, kHeartbeat, kSilence, kCollective };
  Kind kind = Kind::kInit;
  std::string what;             ///< "the process group's init barrier (--init-timeout 10 s)".
  std::string barrier;          ///< kBarrier: the helper barrier's name.
  std::optional<int> rank;      ///< kTimer/kHeartbeat/kSilence: the rank that went quiet.
  PeerPorts arrived;            ///< kInit: store connections that reached the init barrier.
  size_t arrived_left_out = 0;  ///< kInit: hosts whose arrivals did not fit the notice's frame.
  std::optional<CollectiveStall> collective;  ///< kCollective: the collective and every rank.
  std::string noticed_on;                     ///< The host that declared it.
};

nlohmann::json to_json(const StallNotice& notice);
/// The notice as one rendezvous frame carries it to every node, in about `max_bytes` at most
/// whatever the job's size: a collective's rank lists as ranges, its states grouped (see
/// to_compact_json). stall_notice_from_json reads it.
nlohmann::json to_frame_json(const StallNotice& notice, size_t max_bytes);
/// Throws std::exception (a json error, or an unknown kind) on a malformed notice.
StallNotice stall_notice_from_json(const nlohmann::json& json);

/// How far one rank got when the stall was declared.
struct RankProgress {
  /// Ordered: a rank below the furthest rank's level is one the others wait for.
  enum Level { kNotRunning = 0, kNotConnected = 1, kConnected = 2, kArrived = 3 };
  int rank = 0;
  int local_rank = 0;
  std::string host;
  int pid = 0;
  int level = kNotRunning;
  std::string state;      ///< "never connected to the store", "at the barrier", ...
  std::string last_line;  ///< Empty: no output yet.
  double last_line_age_s = -1;
  std::string stack_file;  ///< Empty: no dump.
  std::string hint;  ///< What its last output means (diagnose/failure_hints); empty: nothing known.
};

nlohmann::json to_json(const RankProgress& progress);
RankProgress rank_progress_from_json(const nlohmann::json& json);

/// The level of the rank that got furthest; a rank below it is one the others waited for.
int furthest_level(const std::vector<RankProgress>& ranks);

/// The report: the stall, who arrived and who did not, per rank its state, last output and
/// stack dump. Plain text that reads well in a CI log.
std::string format_stall_report(const StallNotice& notice, std::vector<RankProgress> ranks,
                                int world_size);

}  // namespace mcprun
