// Follows one attempt's process-group init through the job store: which client connections
// arrived, and whether the whole world passed the init barrier.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "launcher/store/tcp_store.hpp"

namespace mcprun {

/// Client ports by client address, of the connections that reached the init barrier (compact
/// enough for the stall notice of a several-thousand-rank job).
using PeerPorts = std::map<std::string, std::vector<int>>;

class InitBarrierWatch {
 public:
  /// `barrier_runs`: torch runs its store barrier (TORCH_DIST_INIT_BARRIER is not "0"). Without
  /// it, init counts as passed once every rank has published its process-group keys.
  InitBarrierWatch(int world_size, bool barrier_runs)
      : world_size_(world_size), barrier_runs_(barrier_runs) {}

  /// Feeds one store event (the store reports every connection and counter change).
  void observe(const StoreEvent& event);
  bool passed() const { return passed_; }
  /// Some rank has reached the store: the job does use env:// init.
  bool any_connected() const { return connected_ever_; }
  PeerPorts arrived() const;

 private:
  using Peer = std::pair<std::string, int>;
  int world_size_;
  bool barrier_runs_;
  bool passed_ = false;
  bool connected_ever_ = false;
  std::set<Peer> arrived_;
};

}  // namespace mcprun
