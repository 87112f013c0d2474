#include "rendezvous/lease_book.hpp"

#include <algorithm>
#include <set>

namespace mcprun {

LeaseBook::LeaseBook(std::vector<std::string> gpus, int first_port, int last_port)
    : gpus_(std::move(gpus)), first_port_(first_port), last_port_(last_port) {}

std::optional<Lease> LeaseBook::grant(uint64_t id, int gpu_count, std::string holder,
                                      const std::function<bool(int)>& port_free) {
  std::set<std::string> held_gpus;
  std::set<int> held_ports;
  for (const auto& [other, lease] : leases_) {
    held_gpus.insert(lease.gpus.begin(), lease.gpus.end());
    held_ports.insert(lease.port);
  }
  Lease lease;
  lease.holder = std::move(holder);
  for (const std::string& gpu : gpus_)
    if (static_cast<int>(lease.gpus.size()) < gpu_count && !held_gpus.contains(gpu))
      lease.gpus.push_back(gpu);
  if (static_cast<int>(lease.gpus.size()) < gpu_count) return std::nullopt;
  for (int port = first_port_; port <= last_port_ && lease.port == 0; ++port)
    if (!held_ports.contains(port) && port_free(port)) lease.port = port;
  if (lease.port == 0) return std::nullopt;
  return leases_[id] = lease;
}

bool LeaseBook::restore(uint64_t id, Lease lease) {
  for (const auto& [other, held] : leases_) {
    if (held.port == lease.port) return false;
    for (const std::string& gpu : lease.gpus)
      if (std::find(held.gpus.begin(), held.gpus.end(), gpu) != held.gpus.end()) return false;
  }
  leases_[id] = std::move(lease);
  return true;
}

void LeaseBook::release(uint64_t id) { leases_.erase(id); }

size_t LeaseBook::leased_gpus() const {
  size_t count = 0;
  for (const auto& [id, lease] : leases_) count += lease.gpus.size();
  return count;
}

std::string LeaseBook::shortage(int gpu_count) const {
  std::string text = std::to_string(gpu_count) + " GPU(s) wanted, " +
                     std::to_string(gpus_.size() - leased_gpus()) + " of " +
                     std::to_string(gpus_.size()) + " free";
  if (leases_.empty()) return text;
  text += "; held by";
  for (const auto& [id, lease] : leases_) {
    text += " " + lease.holder + " (";
    for (size_t i = 0; i < lease.gpus.size(); ++i) text += (i ? "," : "") + lease.gpus[i];
    text += lease.gpus.empty() ? "port " : ", port ";
    text += std::to_string(lease.port) + ");";
  }
  text.pop_back();
  return text;
}

}  // namespace mcprun
