#include "rendezvous/lease_queue.hpp"

#include <algorithm>

namespace mcprun {

LeaseQueue::LeaseQueue(LeaseBook book, PortProbe port_free)
    : book_(std::move(book)), port_free_(std::move(port_free)) {}

void LeaseQueue::enqueue(std::weak_ptr<void> waiter, int gpu_count, std::string holder,
                         std::unique_ptr<boost::asio::steady_timer> deadline) {
  waiting_.push_back({std::move(waiter), gpu_count, std::move(holder), std::move(deadline)});
}

std::vector<LeaseQueue::Grant> LeaseQueue::grant_waiting() {
  std::vector<Grant> grants;
  // While an older request waits for GPUs, no younger one takes any; port-only ones pass.
  bool gpus_spoken_for = false;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    auto waiter = it->waiter.lock();
    if (!waiter) {
      it = waiting_.erase(it);
      continue;
    }
    const uint64_t id = next_id_;
    std::optional<Lease> lease;
    if (!gpus_spoken_for || it->gpu_count == 0)
      lease = book_.grant(id, it->gpu_count, it->holder, port_free_);
    if (!lease) {
      gpus_spoken_for = gpus_spoken_for || it->gpu_count > 0;
      ++it;
      continue;
    }
    ++next_id_;
    grants.push_back({std::move(waiter), id, std::move(*lease)});
    it = waiting_.erase(it);
  }
  return grants;
}

bool LeaseQueue::withdraw(const void* waiter) {
  return std::erase_if(waiting_,
                       [&](const Waiting& w) { return w.waiter.lock().get() == waiter; }) > 0;
}

std::optional<uint64_t> LeaseQueue::restore(Lease lease) {
  const uint64_t id = next_id_++;
  if (!book_.restore(id, std::move(lease))) return std::nullopt;
  return id;
}

std::string LeaseQueue::position(const void* waiter, int gpu_count) const {
  std::string text = book_.shortage(gpu_count), ahead;
  for (const Waiting& waiting : waiting_) {
    if (waiting.waiter.lock().get() == waiter) break;
    if (waiting.gpu_count > 0)
      ahead += " " + waiting.holder + " (" + std::to_string(waiting.gpu_count) + " GPU(s));";
  }
  if (!ahead.empty()) text += "; waiting first:" + ahead.substr(0, ahead.size() - 1);
  return text;
}

}  // namespace mcprun
