#include "launcher/watch/link_check.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "common/sys.hpp"

namespace mcprun {
void LinkSamples::add(int rank, const std::vector<QueuedConnection>& connections, int store_port) {
  for (const QueuedConnection& connection : connections) {
    if (connection.remote.port == store_port) continue;
    const std::string remote =
        connection.remote.address.find(':') == std::string::npos
            ? fmt::format("{}:{}", connection.remote.address, connection.remote.port)
            : fmt::format("[{}]:{}", connection.remote.address, connection.remote.port);
    Queued& queued = queued_[{rank, remote}];
    queued.bytes += connection.send_queue;
    queued.full += connection.send_queue >= kSlowLinkQueueBytes;
  }
}

std::optional<std::string> LinkSamples::verdict(const std::string& host, int samples) const {
  if (queued_.empty() || samples <= 0) return std::nullopt;
  const auto fullest = std::max_element(
      queued_.begin(), queued_.end(),
      [](const auto& a, const auto& b) { return a.second.bytes < b.second.bytes; });
  if (2 * fullest->second.full < samples) return std::nullopt;
  const double mean = static_cast<double>(fullest->second.bytes) / samples;
  return fmt::format(
      "slow link: rank {} (node {}) sends to {} slowly: its connection's send queue held {} on "
      "average over {:.0f} s, data that the link had not carried yet",
      fullest->first.first, host, fullest->first.second, human_bytes(mean),
      std::chrono::duration<double>(kLinkSampleInterval * samples).count());
}

void LinkCheck::start(Ranks ranks, int store_port, std::function<void(const std::string&)> say) {
  if (running_) return;
  running_ = true;
  ranks_ = std::move(ranks);
  store_port_ = store_port;
  say_ = std::move(say);
  samples_ = {};
  taken_ = 0;
  sample();
}

void LinkCheck::cancel() {
  running_ = false;
  timer_.cancel();
}

void LinkCheck::sample() {
  for (const auto& [rank, pid] : ranks_()) samples_.add(rank, send_queues(pid), store_port_);
  if (++taken_ < kLinkSamples) {
    timer_.expires_after(kLinkSampleInterval);
    timer_.async_wait([this](boost::system::error_code ec) {
      if (!ec && running_) sample();
    });
    return;
  }
  running_ = false;
  if (auto line = samples_.verdict(host_, taken_)) say_(*line);
}

}  // namespace mcprun
