// One rendezvous round of one job: who joined, when the round completes, and the rank order.
// Pure logic over an injected clock, so the daemon, the embedded server and the tests share it.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/messages.hpp"

namespace mcprun {

using Clock = std::chrono::steady_clock;

/// What a node tells the rendezvous when it joins.
struct NodeInfo {
  std::string node;                           ///< Node name (hostname unless overridden).
  std::string addr;                           ///< The address it reached the rendezvous from.
  int nproc = 1;                              ///< Its local world size.
  int master_port = 0;                        ///< The port it reserved, used if it becomes rank 0.
  std::map<std::string, std::string> labels;  ///< Topology labels such as rack=r1,switch=s3.
  int requested_rank = -1;                    ///< An explicit --node-rank, or -1.
  int gpu_count = 0;                          ///< GPUs the node pinned, for the operator's log.
};

/// When a round completes; torchrun's rdzv-conf keys with shorter, finite defaults.
struct RoundSettings {
  int min_nodes = 1;
  int max_nodes = 1;
  std::chrono::milliseconds join_timeout{kDefaultJoinTimeout};
  std::chrono::milliseconds last_call_timeout{kDefaultLastCallTimeout};
  std::vector<std::string> label_precedence{"rack", "switch"};
};

/// One node's place in a completed round.
struct NodeAssignment {
  std::string node;
  std::string addr;
  int group_rank = 0;
  int rank_offset = 0;  ///< Global rank of its local rank 0: ranks are contiguous per node.
  int nproc = 1;
};

/// The job-wide result every agent receives.
struct RoundResult {
  std::vector<NodeAssignment> nodes;  ///< In group-rank order.
  int world_size = 0;
  std::string master_addr;  ///< Group rank 0's address.
  int master_port = 0;      ///< The port group rank 0 reserved.
};

/// Orders nodes: explicit ranks keep their slot; the rest fill the free slots sorted by their
/// labels in precedence order (a node without a label sorts after those with one), then address,
/// then name. Deterministic, so nodes sharing a switch get contiguous ranks.
RoundResult assign_ranks(std::vector<NodeInfo> nodes, const std::vector<std::string>& precedence);

/// The join/last-call/timeout state machine of one round.
class RendezvousRound {
 public:
  enum class State { kJoining, kComplete, kTimedOut };

  RendezvousRound(RoundSettings settings, Clock::time_point opened);

  /// Adds a node; an error line when the round is closed, full, or the name or rank is taken.
  std::optional<std::string> join(NodeInfo node, Clock::time_point now);
  /// Removes a node that left before the round completed (its connection dropped).
  void leave(const std::string& node);
  /// Moves the state on as time passes; call on every join and at next_deadline().
  State advance(Clock::time_point now);
  /// The next moment at which advance() may change the state.
  Clock::time_point next_deadline() const;

  State state() const { return state_; }
  const RoundResult& result() const { return result_; }
  /// For a timed-out round: who joined (names and addresses) and how many were expected.
  std::string timeout_message() const;
  size_t joined() const { return nodes_.size(); }

 private:
  void complete();

  RoundSettings settings_;
  Clock::time_point opened_;
  std::optional<Clock::time_point> min_reached_;
  std::vector<NodeInfo> nodes_;
  /// Who joined, by name and by the node rank asked for: a join looks both up instead of
  /// comparing itself with every node (seconds of CPU at 16,384 nodes).
  std::unordered_set<std::string> names_;
  std::unordered_map<int, std::string> requested_ranks_;
  State state_ = State::kJoining;
  RoundResult result_;
};

}  // namespace mcprun
