// Follows one attempt's process-group init through the job store: which client connections
// arrived, and whether the whole world passed the init barrier.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "launcher/tcp_store.hpp"

namespace mcprun {

/// Client ports by client address, of the connections that reached the init barrier (compact
/// enough for the stall notice of a several-thousand-rank job).
using PeerPorts = std::map<std::string, std::vector<int>>;

class InitBarrierWatch {
 public:
  InitBarrierWatch(int restart_count, int world_size)
      : restart_count_(restart_count), world_size_(world_size) {}

  /// Feeds one store event (the store reports every connection and counter change).
  void observe(const StoreEvent& event);
  bool passed() const { return passed_; }
  /// Some rank has reached the store: the job does use env:// init.
  bool any_connected() const { return connected_ever_; }
  PeerPorts arrived() const;

 private:
  int restart_count_;
  int world_size_;
  bool passed_ = false;
  bool connected_ever_ = false;
  std::set<std::pair<std::string, int>> arrived_;
};

}  // namespace mcprun
