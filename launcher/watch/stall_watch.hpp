// The watchdogs that turn a silent hang into a stall: the init barrier (seen through the job
// store this node hosts), torch's FileTimer scopes, helper heartbeats and barriers, and output
// silence. Each declares a StallNotice; the launcher then diagnoses, dumps stacks and stops.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launcher/config/launch_config.hpp"
#include "launcher/plan/rank_plan.hpp"
#include "launcher/store/init_barrier.hpp"
#include "launcher/store/tcp_store.hpp"
#include "launcher/watch/agent_channel.hpp"
#include "launcher/watch/collective_watch.hpp"
#include "launcher/watch/file_timer.hpp"
#include "launcher/watch/link_check.hpp"
#include "launcher/watch/stall_report.hpp"
#include "launcher/watch/straggler_watch.hpp"

namespace mcprun {

/// One worker as the watchdogs and the stall report see it.
struct WorkerStatus {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;  ///< 0: never started.
  bool running = false;
  std::string ended;      ///< How it ended, once not running: "exit code 1".
  std::string last_line;  ///< Empty: no output yet.
  std::chrono::steady_clock::time_point last_output;
  std::filesystem::path stack_file;
};

/// What an attempt's watchdogs report to the launcher.
struct StallHooks {
  std::function<void(const StallNotice&)> on_stall;
  std::function<std::vector<WorkerStatus>()> workers;
  /// Set when barriers span nodes: forwards one local arrival to the rendezvous, which answers
  /// with complete_barrier() once every rank of the job is there.
  std::function<void(const std::string& name, int rank)> forward_barrier_arrival;
  /// A straggler line this node printed: for every other node's console, and its picture.
  std::function<void(const std::string& line)> on_straggler_line;
};

class StallWatch {
 public:
  /// Creates the FileTimer pipe and the helper's socket under `runtime_dir`. `host` is what the
  /// ranks' records call this machine; `node` what the lines call this node (--node-name).
  StallWatch(boost::asio::io_context& io, StallSettings settings, std::string host,
             const std::filesystem::path& runtime_dir, std::string node = {});
  ~StallWatch();

  /// What the job store this node serves reports to the init barrier watchdog: the launch that
  /// owns the store passes it to TcpStoreServer, which calls it for every event.
  TcpStoreServer::Listener store_observer();
  /// The job store the init barrier is watched through, owned by the launch; nullptr when this
  /// node serves none (it is not the master), so the barrier is watched on the master only.
  void observe_store(const TcpStoreServer* store) { observed_store_ = store; }

  /// Arms every watchdog for one attempt of `world_size` ranks; `master_port` is the store's.
  void begin_attempt(int world_size, int master_port, StallHooks hooks);
  /// Disarms them; nothing fires until the next begin_attempt.
  void end_attempt();
  /// Every rank of the job reached barrier `name`: answer the local ones.
  void complete_barrier(const std::string& name);
  /// Each rank's last collective progress, when any rank was in a collective (see
  /// CollectiveWatch::ranks_in_collectives); empty where this node judges none.
  std::map<int, std::string> ranks_in_collectives() const;
  /// When each rank's interpreter began to exit, by its last record; empty where this node judges
  /// none.
  std::map<int, std::chrono::system_clock::time_point> exiting_ranks() const;
  /// Every straggler the straggler watch named in this attempt; empty where this node judges none.
  std::vector<StragglerEpisode> stragglers() const;
  /// A collective was named slow (here, or on the store's node): find whether one of this node's
  /// ranks sends on the slow link, and say so through on_straggler_line.
  void check_links();
  /// Every slow collective the bandwidth watch named in this attempt; empty where none.
  std::vector<SlowCollective> slow_collectives() const;
  /// --preflight's all-reduce bus bandwidth at `bytes`: the floor under which it is slow.
  void set_bandwidth_floor(int64_t bytes, double busbw) { bandwidth_floor_.emplace(bytes, busbw); }
  /// The straggler watch of the attempt running now; null where there is none.
  const StragglerWatch* straggler_watch() const { return stragglers_ ? &*stragglers_ : nullptr; }
  /// How far each local worker got, as the report shows it.
  std::vector<RankProgress> diagnose(const StallNotice& notice,
                                     const std::vector<WorkerStatus>& workers) const;

 private:
  struct Barrier {
    std::set<int> arrived;  ///< Local ranks waiting at it.
    std::unique_ptr<boost::asio::steady_timer> deadline;
    double timeout_s = 0;
  };
  void on_store_event(const StoreEvent& event);
  void on_progress_record(const std::string& key);
  /// Looks at the ranks' progress once per reporting interval.
  void arm_collective_check();
  void on_collective_check();
  /// Names a straggler or a slow collective, or its change or end, in one line on this node's
  /// console and through on_straggler_line.
  void check_stragglers();
  void arm_init_deadline();
  void on_init_deadline();
  void on_heartbeat(int rank);
  void on_barrier(int rank, const std::string& name, double timeout_s);
  void on_timer_expired(const ExpiredTimer& expired);
  /// Arms the activity timer at the earliest heartbeat or silence deadline.
  void arm_activity_deadline();
  void on_activity_deadline();
  void declare(StallNotice notice);

  boost::asio::io_context& io_;
  StallSettings settings_;
  std::string host_;
  FileTimerServer file_timer_;
  AgentChannel channel_;
  const TcpStoreServer* observed_store_ = nullptr;  ///< The launch's; only its events are read.

  // The current attempt; reset by begin_attempt.
  bool armed_ = false;
  bool stalled_ = false;
  int world_size_ = 1;
  int master_port_ = 0;
  StallHooks hooks_;
  std::optional<InitBarrierWatch> init_;
  /// No rank had reached the store by the first deadline: the next one counts from the first.
  boost::asio::steady_timer init_deadline_;
  boost::asio::steady_timer activity_deadline_;
  std::optional<CollectiveWatch> collectives_;     ///< On the node that serves the job store.
  std::optional<StragglerWatch> stragglers_;       ///< Beside it, unless --straggler-window off.
  std::vector<StragglerEpisode> last_stragglers_;  ///< The ended attempt's, for the summary.
  std::vector<SlowCollective> last_slow_collectives_;
  std::optional<std::pair<int64_t, double>> bandwidth_floor_;
  boost::asio::steady_timer collective_check_;
  LinkCheck links_;
  std::chrono::steady_clock::time_point attempt_start_;
  std::map<int, std::chrono::steady_clock::time_point> last_heartbeat_;
  std::map<std::string, Barrier> barriers_;
};

}  // namespace mcprun
