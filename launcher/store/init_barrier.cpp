#include "launcher/store/init_barrier.hpp"

#include "launcher/store/torch_keys.hpp"

namespace mcprun {

void InitBarrierWatch::observe(const StoreEvent& event) {
  if (event.kind == StoreEvent::Kind::kConnected) connected_ever_ = true;
  if (passed_ || (event.kind != StoreEvent::Kind::kAdd && event.kind != StoreEvent::Kind::kSet))
    return;
  const Peer peer{event.peer.address().to_string(), event.peer.port()};
  if (event.kind == StoreEvent::Kind::kAdd && torch_keys::is_init_barrier(event.key)) {
    // Each rank adds 1 once, then polls with add(0) until the count reaches the world.
    arrived_.insert(peer);
    if (event.value >= world_size_) passed_ = true;
  } else if (!barrier_runs_ && torch_keys::is_default_group_key(event.key)) {
    // No barrier to watch: a rank that publishes its process-group address has reached init.
    arrived_.insert(peer);
    if (static_cast<int>(arrived_.size()) >= world_size_) passed_ = true;
  }
}

PeerPorts InitBarrierWatch::arrived() const {
  PeerPorts ports;
  for (const auto& [address, port] : arrived_) ports[address].push_back(port);
  return ports;
}

}  // namespace mcprun
