// Which local job holds which GPUs and which master port, so that several users' jobs on one box
// never share either. Pure bookkeeping; the server ties each lease to its agent's connection.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mcprun {

/// What one job holds.
struct Lease {
  std::vector<std::string> gpus;  ///< PCI bus ids, in topology order.
  int port = 0;
  std::string holder;  ///< "alice (uid 1000), job x": for messages naming who holds what.
};

class LeaseBook {
 public:
  /// `gpus`: every GPU of the box in topology order; master ports come from [first, last].
  LeaseBook(std::vector<std::string> gpus, int first_port, int last_port);

  /// Grants `gpu_count` free GPUs (the first free ones in topology order) and a free port to
  /// lease `id`; nullopt when not enough are free. `port_free` says whether the OS agrees.
  std::optional<Lease> grant(uint64_t id, int gpu_count, std::string holder,
                             const std::function<bool(int)>& port_free);
  /// Re-grants exactly what a running job held before a daemon restart; false if any is taken.
  bool restore(uint64_t id, Lease lease);
  void release(uint64_t id);
  /// "4 GPU(s) wanted, 2 free; held: alice (uid 1000), job x: 0000:01:00.0,0000:02:00.0; ..."
  std::string shortage(int gpu_count) const;
  size_t gpu_count() const { return gpus_.size(); }
  size_t leased_gpus() const;
  /// Master ports leased: one per lease.
  size_t leased_ports() const { return leases_.size(); }

 private:
  std::vector<std::string> gpus_;
  int first_port_, last_port_;
  std::map<uint64_t, Lease> leases_;
};

}  // namespace mcprun
