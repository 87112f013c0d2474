// The queue of local jobs waiting for GPUs: strictly first come, first served for GPUs, so that a
// job wanting many is not starved by a stream of small ones, while port-only requests pass. What
// the LeaseBook grants, in which order, and to whom; the server sends the answers.
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/lease_book.hpp"

namespace mcprun {

class LeaseQueue {
 public:
  /// Whether nothing on this host holds a port (the OS's view, which the book does not have).
  using PortProbe = std::function<bool(int port)>;

  /// One request the queue could grant: its waiter, the lease's id and what it holds.
  struct Grant {
    std::shared_ptr<void> waiter;
    uint64_t id = 0;
    Lease lease;
  };

  LeaseQueue(LeaseBook book, PortProbe port_free);

  /// Queues a request of `waiter` (the server's session; a request whose waiter is gone is
  /// dropped) for `gpu_count` GPUs and a port, behind every older one. `deadline`, when the
  /// request may wait, is the timer that ends its wait; it is cancelled with the request.
  void enqueue(std::weak_ptr<void> waiter, int gpu_count, std::string holder,
               std::unique_ptr<boost::asio::steady_timer> deadline = nullptr);
  /// Grants what waiting requests can now have, oldest first; the granted leave the queue.
  std::vector<Grant> grant_waiting();
  /// Takes `waiter`'s request out of the queue; whether it had one.
  bool withdraw(const void* waiter);
  /// Drops every waiting request, answering none.
  void clear_waiting() { waiting_.clear(); }

  /// Re-grants exactly what a running job held before a daemon restart; its lease id, or nullopt
  /// when any of it is taken now.
  std::optional<uint64_t> restore(Lease lease);
  /// The job holding lease `id` ended: its GPUs and port are free (grant_waiting() hands them on).
  void release(uint64_t id) { book_.release(id); }

  /// "4 GPU(s) wanted, 2 of 8 free; held by ...; waiting first: bob (uid 1001), job y (8 GPU(s))":
  /// why `waiter` has no lease yet.
  std::string position(const void* waiter, int gpu_count) const;
  size_t gpu_count() const { return book_.gpu_count(); }
  size_t leased_gpus() const { return book_.leased_gpus(); }
  size_t leased_ports() const { return book_.leased_ports(); }
  size_t waiting_count() const { return waiting_.size(); }

 private:
  struct Waiting {
    std::weak_ptr<void> waiter;
    int gpu_count = 0;
    std::string holder;
    std::unique_ptr<boost::asio::steady_timer> deadline;
  };

  LeaseBook book_;
  PortProbe port_free_;
  std::deque<Waiting> waiting_;
  uint64_t next_id_ = 1;
};

}  // namespace mcprun
