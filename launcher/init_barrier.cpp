#include "launcher/init_barrier.hpp"

#include "launcher/torch_keys.hpp"

namespace mcprun {

void InitBarrierWatch::observe(const StoreEvent& event) {
  switch (event.kind) {
    case StoreEvent::Kind::kConnected:
      connected_ever_ = true;
      return;
    case StoreEvent::Kind::kAdd:
      if (passed_ || !torch_keys::is_init_barrier(event.key, restart_count_)) return;
      // Each rank adds 1 once, then polls with add(0) until the count reaches the world.
      arrived_.emplace(event.peer.address().to_string(), event.peer.port());
      if (event.value >= world_size_) passed_ = true;
      return;
    default:
      return;
  }
}

PeerPorts InitBarrierWatch::arrived() const {
  PeerPorts ports;
  for (const auto& [address, port] : arrived_) ports[address].push_back(port);
  return ports;
}

}  // namespace mcprun
