// Supervises one node's workers: spawns them, relays output, reacts to exits and signals, and
// stops the whole group (SIGTERM, grace, SIGKILL, reap everything) on the first failure.
#pragma once

#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "launcher/config/launch_config.hpp"
#include "launcher/plan/rank_plan.hpp"
#include "launcher/process/process_control.hpp"
#include "launcher/supervise/failure_report.hpp"
#include "launcher/supervise/output_relay.hpp"
#include "launcher/watch/stack_dump.hpp"
#include "launcher/watch/stall_watch.hpp"

namespace mcprun {

/// How long SIGKILLed processes get to be reaped before mcprun gives up on them and exits.
inline constexpr std::chrono::seconds kKillReapTimeout{5};
/// How long output still buffered in pipes may take to arrive once every worker is dead.
inline constexpr std::chrono::seconds kOutputDrainTimeout{2};
/// How long stalled Python workers get to print faulthandler's tracebacks after SIGABRT.
inline constexpr std::chrono::seconds kTracebackTimeout{2};

/// How an attempt ended.
struct AttemptResult {
  enum class End {
    kSucceeded,
    kWorkerFailed,
    kInterrupted,
    kSpawnFailed,
    kPeerStopped,
    kStalled
  } end = End::kSucceeded;
  std::vector<WorkerOutcome> workers;
  size_t first_failure = 0;          ///< Index into workers, for kWorkerFailed.
  int interrupt_signal = 0;          ///< For kInterrupted.
  std::string spawn_error;           ///< For kSpawnFailed.
  std::string peer_reason;           ///< For kPeerStopped: what another node reported.
  int peer_exit_code = 0;            ///< For kPeerStopped.
  std::optional<StallNotice> stall;  ///< For kStalled.
};

/// Where an attempt's per-rank files go.
struct AttemptFiles {
  std::filesystem::path attempt_dir;  ///< <run dir>/attempt_<n>; holds one folder per local rank.
  bool keep_logs = false;             ///< Write stdout.log/stderr.log per rank.
};

/// One node's worker group across restarts. Owns the launcher's signal handling meanwhile.
class WorkerGroup {
 public:
  WorkerGroup(boost::asio::io_context& io, ProcessControl& control, const RankPlan& plan,
              const LaunchConfig& config, const Environment& inherited);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  /// Starts every worker of attempt `restart_count` and supervises them until all are gone; with
  /// a stand-in, the ranks run it instead of the script.
  AttemptResult run_attempt(int restart_count, const AttemptFiles& files,
                            const StandIn* stand_in = nullptr);
  /// Another node failed or vanished: stop this node's group too (callable from the event loop).
  void request_stop(std::string reason, int exit_code);
  /// The job stalled (here or on another node): diagnose, dump stacks, then stop the group.
  void request_stall(StallNotice notice);
  /// Called once per stall with every worker's status, before stacks are dumped.
  void on_stall(
      std::function<void(const StallNotice&, const std::vector<WorkerStatus>&)> listener) {
    stall_listener_ = std::move(listener);
  }
  /// Every worker of the current attempt, as the watchdogs see it.
  std::vector<WorkerStatus> status() const;
  /// Called the moment the first worker fails, before the group is stopped, so that other
  /// nodes hear of it without waiting for this node's grace period.
  void on_first_failure(std::function<void(const WorkerOutcome&)> listener) {
    failure_listener_ = std::move(listener);
  }

 private:
  struct Worker {
    const RankSlot* slot;
    pid_t pid = 0;
    bool running = false;
    std::unique_ptr<RankOutput> output;
    WorkerOutcome outcome;
    std::filesystem::path dir;            ///< <attempt dir>/<local rank>: its logs and dumps.
    std::filesystem::path stack_file;     ///< Empty under --no-stack-dumps.
    std::vector<std::string> tracebacks;  ///< stderr after SIGABRT: faulthandler's dump.
  };
  // run_attempt's steps, in order.
  void reset_attempt();
  /// A Worker per slot of the plan: its folder, its output relay, its outcome's identity.
  void prepare_workers(const AttemptFiles& files);
  /// Starts every worker, unless interrupted first; a failed spawn ends the attempt.
  void spawn_workers(int restart_count, AttemptResult& result, const StandIn* stand_in);
  /// Runs the loop until every worker ended, one failed, or a signal, peer stop or stall came.
  void supervise();
  /// A stall's diagnosis and dumps, then the whole group stopped and reaped.
  void stop_attempt();
  /// Each worker's last output and outcome, once its pipes are drained.
  void collect_outcomes(AttemptResult& result);
  /// Which ending the attempt had: a stall, another node's stop, a signal, a worker's failure.
  void classify_ending(AttemptResult& result) const;

  void wait_for_signals();
  void on_signal(int signal);
  /// The terminal was resized: every rank's pseudo-terminals follow, and their groups hear it.
  void on_window_change();
  void on_child_exits();
  /// Soft signal to every group (unless already delivered), grace period, SIGKILL, reap all.
  void stop_all(int soft_signal, bool already_delivered);
  void signal_all(int signal);
  /// Runs the event loop until `done()` or the deadline; returns done().
  bool run_until(const std::function<bool()>& done, std::chrono::steady_clock::duration limit);
  size_t running_count() const;
  /// A stall's teardown before stop_all: listener, Flight Recorder dumps, native stack dumps,
  /// Python tracebacks.
  void dump_stalled_workers();
  /// Waits for each running rank's Flight Recorder dump, which its reporter writes on a
  /// collective stall.
  void await_flight_recorder_dumps();

  boost::asio::io_context& io_;
  ProcessControl& control_;
  const RankPlan& plan_;
  const LaunchConfig& config_;
  const Environment& inherited_;
  boost::asio::signal_set signals_;
  Console stdout_console_{STDOUT_FILENO};
  Console stderr_console_{STDERR_FILENO, stdout_console_};
  std::vector<Worker> workers_;
  std::filesystem::path attempt_dir_;
  std::optional<size_t> first_failure_;
  int interrupt_signal_ = 0;
  bool stopping_ = false;
  bool escalate_ = false;  ///< A second interrupt while stopping: SIGKILL now.
  std::optional<std::pair<std::string, int>> peer_stop_;
  std::optional<StallNotice> stall_;
  std::function<void(const WorkerOutcome&)> failure_listener_;
  std::function<void(const StallNotice&, const std::vector<WorkerStatus>&)> stall_listener_;
  StackDumper dumper_;
  bool python_tracebacks_;  ///< Workers run with faulthandler, so SIGABRT prints tracebacks.
  /// Expires with this group, so that an exit notice posted to the loop finds it gone.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace mcprun
