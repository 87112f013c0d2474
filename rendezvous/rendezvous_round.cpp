#include "rendezvous/rendezvous_round.hpp"

#include <algorithm>
#include <tuple>

namespace mcprun {

RoundResult assign_ranks(std::vector<NodeInfo> nodes, const std::vector<std::string>& precedence) {
  auto sort_key = [&](const NodeInfo& node) {
    std::vector<std::pair<int, std::string>> labels;  // (0 = has label, value); 1 sorts after.
    for (const auto& name : precedence) {
      auto it = node.labels.find(name);
      labels.emplace_back(it == node.labels.end() ? 1 : 0,
                          it == node.labels.end() ? "" : it->second);
    }
    return std::tuple(labels, node.addr, node.node);
  };
  std::vector<NodeInfo> free_nodes;
  std::vector<std::optional<NodeInfo>> slots(nodes.size());
  for (NodeInfo& node : nodes) {
    if (node.requested_rank >= 0 && node.requested_rank < static_cast<int>(slots.size()) &&
        !slots[node.requested_rank])
      slots[node.requested_rank] = std::move(node);
    else
      free_nodes.push_back(std::move(node));
  }
  // Each key built once, not twice per comparison: 16,384 nodes sort in milliseconds.
  std::vector<std::pair<decltype(sort_key(free_nodes.front())), size_t>> order;
  order.reserve(free_nodes.size());
  for (size_t i = 0; i < free_nodes.size(); ++i) order.emplace_back(sort_key(free_nodes[i]), i);
  std::sort(order.begin(), order.end());
  auto next_free = order.begin();
  for (auto& slot : slots)
    if (!slot) slot = std::move(free_nodes[(next_free++)->second]);

  RoundResult result;
  for (size_t rank = 0; rank < slots.size(); ++rank) {
    const NodeInfo& node = *slots[rank];
    result.nodes.push_back(
        {node.node, node.addr, static_cast<int>(rank), result.world_size, node.nproc});
    result.world_size += node.nproc;
  }
  if (!slots.empty()) {
    result.master_addr = slots[0]->addr;
    result.master_port = slots[0]->master_port;
  }
  return result;
}

RendezvousRound::RendezvousRound(RoundSettings settings, Clock::time_point opened)
    : settings_(std::move(settings)), opened_(opened) {}

std::optional<std::string> RendezvousRound::join(NodeInfo node, Clock::time_point now) {
  if (advance(now) != State::kJoining) return "the rendezvous round is already closed";
  if (static_cast<int>(nodes_.size()) >= settings_.max_nodes)
    return "the round is full (" + std::to_string(settings_.max_nodes) + " nodes)";
  if (names_.contains(node.node)) return "a node named '" + node.node + "' already joined";
  if (auto taken = requested_ranks_.find(node.requested_rank); taken != requested_ranks_.end())
    return "node rank " + std::to_string(node.requested_rank) + " is already taken by '" +
           taken->second + "'";
  if (node.requested_rank >= settings_.max_nodes)
    return "node rank " + std::to_string(node.requested_rank) + " is out of range for " +
           std::to_string(settings_.max_nodes) + " nodes";
  names_.insert(node.node);
  if (node.requested_rank >= 0) requested_ranks_.emplace(node.requested_rank, node.node);
  nodes_.push_back(std::move(node));
  advance(now);
  return std::nullopt;
}

void RendezvousRound::leave(const std::string& node) {
  if (state_ != State::kJoining) return;
  names_.erase(node);
  std::erase_if(requested_ranks_, [&](const auto& taken) { return taken.second == node; });
  std::erase_if(nodes_, [&](const NodeInfo& info) { return info.node == node; });
  if (static_cast<int>(nodes_.size()) < settings_.min_nodes) min_reached_.reset();
}

RendezvousRound::State RendezvousRound::advance(Clock::time_point now) {
  if (state_ != State::kJoining) return state_;
  const int joined = static_cast<int>(nodes_.size());
  if (joined >= settings_.min_nodes && !min_reached_) min_reached_ = now;
  // Explicit node ranks must all fit below the number of nodes that complete the round.
  auto ranks_fit = [&] {
    return std::all_of(nodes_.begin(), nodes_.end(),
                       [&](const NodeInfo& n) { return n.requested_rank < joined; });
  };
  if (joined >= settings_.max_nodes ||
      (min_reached_ && now >= *min_reached_ + settings_.last_call_timeout && ranks_fit())) {
    complete();
  } else if (now >= opened_ + settings_.join_timeout) {
    state_ = State::kTimedOut;
  }
  return state_;
}

Clock::time_point RendezvousRound::next_deadline() const {
  Clock::time_point deadline = opened_ + settings_.join_timeout;
  if (min_reached_) deadline = std::min(deadline, *min_reached_ + settings_.last_call_timeout);
  return deadline;
}

void RendezvousRound::complete() {
  result_ = assign_ranks(nodes_, settings_.label_precedence);
  state_ = State::kComplete;
}

std::string RendezvousRound::timeout_message() const {
  std::vector<std::string> names;
  for (const NodeInfo& node : nodes_) names.push_back(node.node + " (" + node.addr + ")");
  std::sort(names.begin(), names.end());
  std::string joined;
  for (const auto& name : names) joined += (joined.empty() ? "" : ", ") + name;
  const std::string expected =
      settings_.min_nodes == settings_.max_nodes
          ? std::to_string(settings_.max_nodes)
          : std::to_string(settings_.min_nodes) + ":" + std::to_string(settings_.max_nodes);
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(settings_.join_timeout);
  return "timed out after " + std::to_string(seconds.count()) +
         " s: " + std::to_string(nodes_.size()) + " of " + expected + " nodes joined" +
         (joined.empty() ? "" : ": " + joined);
}

}  // namespace mcprun
