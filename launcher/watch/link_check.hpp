// The slow link's sending end. Once a collective is named slow, each node samples its ranks' TCP
// connections for a moment: one whose send queue stays full holds data that its link carries
// slower than the rank writes it. On a ring, the ranks upstream of a slow link starve instead.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/proc_sockets.hpp"

namespace mcprun {

/// Samples a check takes, and how far apart: two seconds of a job's collectives.
inline constexpr int kLinkSamples = 10;
inline constexpr std::chrono::milliseconds kLinkSampleInterval{200};
/// A connection whose send queue held this much in half the samples or more is the slow link's
/// sending end: a fast link drains a burst between two samples.
inline constexpr uint64_t kSlowLinkQueueBytes = 64 << 10;

/// What the samples add up to: pure logic, fed by LinkCheck or a test.
class LinkSamples {
 public:
  /// One sample of `rank`'s connections; the job store's (`store_port`) is not a link between
  /// ranks.
  void add(int rank, const std::vector<QueuedConnection>& connections, int store_port);
  /// The connection with the fullest send queue, when it held kSlowLinkQueueBytes in half the
  /// samples or more:
  /// "slow link: rank 2 (node b) sends to 10.0.0.1:4000 slowly: ...".
  std::optional<std::string> verdict(const std::string& host, int samples) const;

 private:
  struct Queued {
    uint64_t bytes = 0;  ///< Summed over the samples.
    int full = 0;        ///< Samples that held kSlowLinkQueueBytes or more.
  };
  std::map<std::pair<int, std::string>, Queued> queued_;  ///< By (rank, remote end).
};

class LinkCheck {
 public:
  using Ranks = std::function<std::map<int, pid_t>()>;  ///< This node's running ranks' pids.
  LinkCheck(boost::asio::io_context& io, std::string host) : host_(std::move(host)), timer_(io) {}

  /// Samples the ranks' connections, then says the slow link found, if any, through `say`;
  /// nothing while a check is under way.
  void start(Ranks ranks, int store_port, std::function<void(const std::string&)> say);
  void cancel();

 private:
  void sample();

  std::string host_;
  boost::asio::steady_timer timer_;
  Ranks ranks_;
  int store_port_ = 0;
  std::function<void(const std::string&)> say_;
  LinkSamples samples_;
  int taken_ = 0;
  bool running_ = false;
};

}  // namespace mcprun
