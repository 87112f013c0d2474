// One run of `mcprun [flags] script`: lease GPUs, plan the ranks, join the rendezvous, then
// supervise every attempt of the worker group to the job's end.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/exit_status.hpp"
#include "common/metrics_http.hpp"
#include "common/topology.hpp"
#include "launcher/attempt_report.hpp"
#include "launcher/config/launch_config.hpp"
#include "launcher/diagnose/failure_hints.hpp"
#include "launcher/plan/port_reservation.hpp"
#include "launcher/plan/rank_plan.hpp"
#include "launcher/process/process_control.hpp"
#include "launcher/rendezvous/rendezvous_client.hpp"
#include "launcher/report/collective_picture.hpp"
#include "launcher/report/node_metrics.hpp"
#include "launcher/report/run_summary.hpp"
#include "launcher/supervise/worker_group.hpp"
#include "launcher/watch/stall_watch.hpp"
#include "rendezvous/rendezvous_server.hpp"

namespace mcprun {

class RunDirectory;

class Launch {
 public:
  /// Starts, signals and reaps every process through `control`: main's PosixProcessControl, or a
  /// test's fake.
  Launch(const LaunchConfig& config, RunSummary& summary, ProcessControl& control);
  ~Launch();
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;

  /// Runs the job to its end and returns mcprun's exit code.
  int run();

 private:
  /// Takes this job's GPUs and master port from a local rendezvousd, where one leases them.
  std::optional<int> lease_gpus(std::vector<GpuDevice>& gpus);
  /// Reserves MASTER_PORT, builds the rank plan and checks that it fits the open-file limit; an
  /// exit code when the run is over already.
  std::optional<int> plan_ranks(std::vector<GpuDevice> gpus);
  /// The join message this node sends each round; an exit code for a bad token file.
  std::optional<int> prepare_join();
  /// The run folder, the watchdogs, the worker group and the job's --timeout.
  std::optional<int> prepare_supervision();
  /// One rendezvous round: join, move the plan to its place in the job, listen to the others;
  /// an exit code when this node cannot take part.
  std::optional<int> join_round(int restart_count);
  /// --metrics-port: listens, or ends the launch with one line (in use, not an address).
  std::optional<int> serve_metrics();
  /// collectives.html in the run folder, where this node lines up the ranks' collectives.
  void draw_collectives(const std::string& title, const std::string& note,
                        const std::set<int>& missing);
  /// --preflight before the first attempt (preflight_run.hpp); an exit code when a fault must
  /// stop the launch, which the other nodes then hear of.
  std::optional<int> run_preflight();
  /// The master node serves the job store; every rank's env:// init is its client.
  bool serve_store_if_master();
  /// The job store on MASTER_PORT, observed by the watchdogs; false when the port cannot be had.
  bool open_store();
  // launch_messages.cpp: what this node tells the others and hears from them.
  /// Every other node hears of this node's first failure and of a stall's local diagnosis.
  void tell_other_nodes_of_failures_and_stalls();
  /// What another node's failure, stall, stall report, straggler line or barrier does here.
  PeerEvents peer_events();
  /// What the watchdogs do when they judge: stop the group, tell the other nodes, draw.
  StallHooks stall_hooks();
  NodeFacts node_facts() const {
    return {config_, *plan_, inherited_, node_gpus_, hint_probes_, host_};
  }
  /// What an attempt's end means: the exit code, or nullopt to run the next attempt.
  std::optional<int> conclude(const AttemptResult& result, int attempt, int& restart_count);
  std::optional<int> conclude_stall(const AttemptResult& result, int attempt, int restart_count);
  /// The one restart-or-end decision after a failed attempt: `code` when no restart is left or
  /// the job cannot restart (then, with `serve_others`, the embedded rendezvous serves the other
  /// nodes a little longer), else nullopt, said as "restarting the worker group <how>".
  std::optional<int> end_or_restart(int code, int restart_count, std::string_view how,
                                    bool serve_others);
  /// Whether the rendezvous said that this job cannot restart (another node finished), which
  /// then says why.
  bool job_closed();
  /// The host of an embedded rendezvous serves the others until their jobs are over too.
  void serve_remaining_nodes(std::chrono::seconds limit);
  /// Under Slurm, SIGTERM stopped the group: says so, tells the other nodes, kExitSlurmCancelled.
  int cancelled_by_slurm();

  const LaunchConfig& config_;
  RunSummary& summary_;
  const std::string host_;
  std::vector<GpuDevice> node_gpus_;  ///< Every GPU discovered on this node, for the hints.
  const HintProbes hint_probes_ = system_hint_probes();
  Environment inherited_;
  boost::asio::io_context io_;
  std::unique_ptr<RendezvousClient> lease_holder_;  ///< Holds the GPU lease while it lives.
  int leased_port_ = 0;                             ///< The master port rendezvousd leased, or 0.
  std::optional<PortReservation> reservation_;
  long descriptor_limit_ = 0;  ///< RLIMIT_NOFILE once raised: what the plan must fit in.
  std::optional<RankPlan> plan_;
  std::unique_ptr<RendezvousServer> embedded_;
  JoinMessage join_;  ///< This node's join, sent again (with its restart count) each round.
  std::unique_ptr<RunDirectory> run_dir_;
  std::unique_ptr<StallWatch> watch_;
  /// The job's c10d store, served by the master node: every env:// init depends on it, and the
  /// watchdogs only observe it. Declared after watch_, so it is gone before its observer.
  std::unique_ptr<TcpStoreServer> store_;
  ProcessControl& control_;
  std::unique_ptr<WorkerGroup> group_;
  std::unique_ptr<boost::asio::steady_timer> job_deadline_;
  bool timed_out_ = false;
  std::unique_ptr<RendezvousBackend> rendezvous_;
  bool membership_change_ = false;
  bool in_preflight_ = false;  ///< The preflight's ranks run: their ending is no job failure.
  nlohmann::json peer_preflight_verdict_;  ///< The verdict of a node that stopped the preflight.
  /// What the last attempt would have ended with had no restart been left: the exit code when
  /// the job turns out unable to restart.
  int code_without_restart_ = kExitFailure;
  std::set<std::string> reported_nodes_;  ///< Nodes whose stall report arrived this attempt.
  AttemptLastSeen last_seen_;  ///< Where the ranks were as the last attempt ended, for its report.
  int attempt_ = 0;
  /// --metrics-port; declared last, so it is gone before the group and the watch it reads.
  std::optional<MetricsServer> metrics_;
};

}  // namespace mcprun
