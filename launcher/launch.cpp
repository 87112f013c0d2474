#include "launcher/launch.hpp"

#include <unistd.h>

#include <iostream>

#include "common/connection_limits.hpp"
#include "common/descriptor_limit.hpp"
#include "common/endpoint.hpp"
#include "common/event_loop.hpp"
#include "common/exit_status.hpp"
#include "common/logging.hpp"
#include "common/sys.hpp"
#include "launcher/attempt_report.hpp"
#include "launcher/plan/descriptor_budget.hpp"
#include "launcher/preflight_run.hpp"
#include "launcher/rendezvous/node_join.hpp"
#include "launcher/run_directory.hpp"

namespace mcprun {

namespace {

/// How long the node hosting the embedded rendezvous keeps serving after its own workers are
/// done, so the other nodes can report theirs (torchrun's exit barrier).
constexpr std::chrono::seconds kHostExitBarrierTimeout{60};

/// How long a stalled node waits for the other nodes' views of their ranks.
constexpr std::chrono::seconds kStallReportTimeout{5};

/// How long the host of an embedded rendezvous keeps serving after a last failure or stall, so
/// that the other nodes hear of it before the server goes away.
constexpr std::chrono::seconds kFailurePassOnTimeout{2};

}  // namespace

Launch::Launch(const LaunchConfig& config, RunSummary& summary, ProcessControl& control)
    : config_(config),
      summary_(summary),
      host_(host_name()),
      inherited_(current_environment()),
      control_(control) {
  // A job file's env: acts as if exported before mcprun: OMP_NUM_THREADS is honoured, RANK warned.
  for (const auto& [name, value] : config.env) inherited_[name] = value;
  // mcprun's own input (config.log_line_prefix_template), not a stale launcher variable to warn of.
  inherited_.erase(kLogLinePrefixTemplateVariable);
}

Launch::~Launch() = default;

int Launch::run() {
  // Pipes per rank, a store connection or two per rank of the job: the usual soft limit of 1024
  // would not hold a few hundred ranks.
  descriptor_limit_ = raise_descriptor_limit();
  std::vector<GpuDevice> gpus = discover_gpus();
  annotate_with_driver_uuids(gpus);
  node_gpus_ = gpus;
  if (auto code = lease_gpus(gpus)) return *code;
  if (auto code = plan_ranks(std::move(gpus))) return *code;
  if (auto code = prepare_join()) return *code;
  if (auto code = prepare_supervision()) return *code;
  for (int attempt = 0, restart_count = 0;; ++attempt, ++restart_count) {
    // Every attempt of a multi-node job is a fresh round: all nodes restart together.
    attempt_ = attempt;
    if (config_.uses_rendezvous())
      if (auto code = join_round(restart_count)) return *code;
    if (!serve_store_if_master()) return kExitFailure;
    if (attempt == 0)
      if (auto code = run_preflight()) return *code;
    summary_.stall_ranks.clear();
    reported_nodes_.clear();
    watch_->begin_attempt(plan_->job.world_size, plan_->job.master_port, stall_hooks());
    summary_.begin_attempt();
    AttemptResult result = group_->run_attempt(restart_count, run_dir_->attempt(attempt));
    summary_.end_attempt(result, run_dir_->attempt(attempt), plan_->job.world_size);
    last_seen_.in_collectives = watch_->ranks_in_collectives();  // Before end_attempt forgets them.
    if (!config_.log_dir.empty() && result.end != AttemptResult::End::kStalled)
      draw_collectives("end of the attempt", "", {});
    last_seen_.exiting = watch_->exiting_ranks();
    watch_->end_attempt();
    summary_.set_stragglers(watch_->stragglers());
    summary_.set_slow_collectives(watch_->slow_collectives());
    if (auto code = conclude(result, attempt, restart_count)) return *code;
  }
}

std::optional<int> Launch::lease_gpus(std::vector<GpuDevice>& gpus) {
  if (config_.dry_run) return std::nullopt;
  auto lease = lease_from_local_daemon(io_, config_, inherited_, gpus);
  if (!lease) {
    spdlog::error("{}", lease.error().message);
    return kExitRendezvous;
  }
  if (!*lease) return std::nullopt;
  const GrantedLease& granted = (*lease)->granted;
  std::erase_if(gpus, [&](const GpuDevice& gpu) {
    return std::find(granted.gpus.begin(), granted.gpus.end(), gpu.bus_id) == granted.gpus.end();
  });
  spdlog::info("leased from rendezvousd: {} GPU(s), master port {}", granted.gpus.size(),
               granted.port);
  leased_port_ = granted.port;
  lease_holder_ = std::move((*lease)->holder);
  return std::nullopt;
}

std::optional<int> Launch::plan_ranks(std::vector<GpuDevice> gpus) {
  int master_port = config_.master_port.value_or(0);
  if (!config_.master_port) {
    auto reserved = PortReservation::reserve(leased_port_);
    if (!reserved) {
      spdlog::error("cannot reserve a free MASTER_PORT: {}", reserved.error().message);
      return kExitFailure;
    }
    reservation_ = std::move(*reserved);
    master_port = reservation_->port();
  }
  auto planned = build_rank_plan(config_, std::move(gpus), inherited_, master_port);
  if (!planned) return usage_error(planned.error().message);
  plan_ = std::move(*planned);
  if (!config_.dry_run) {
    // Before anything starts (the plan's warnings included): a job that runs out of descriptors
    // halfway through spawning fails with a system call's message and ranks already running. A
    // stall keeps the run folder, and the attempts after it write each rank's logs there.
    const bool log_files = keeps_log_files(config_) || config_.max_restarts > 0;
    const long needed = descriptors_needed(config_, *plan_, log_files);
    if (auto fits = check_descriptor_limit(config_, *plan_, needed, descriptor_limit_); !fits)
      return usage_error(fits.error().message);
  }
  for (const auto& warning : plan_->warnings) spdlog::warn("{}", warning);
  if (config_.dry_run) {  // What the workers would get, with the run's folder still unmade.
    add_supervision_env(*plan_, kDryRunDir, config_.stall.collective_timeout > 0, inherited_);
    std::cout << format_rank_plan(*plan_, inherited_);
    return kExitSuccess;
  }
  return std::nullopt;
}

std::optional<int> Launch::prepare_join() {
  if (!config_.uses_rendezvous()) return std::nullopt;
  if (config_.rdzv_backend == "c10d") embedded_ = host_embedded_rendezvous(io_, config_);
  const std::string node =
      config_.node_name.empty() ? host_ + ":" + std::to_string(::getpid()) : config_.node_name;
  auto join = join_message(config_, *plan_, node);
  if (!join) return usage_error(join.error().message);
  join_ = std::move(*join);
  return std::nullopt;
}

std::optional<int> Launch::prepare_supervision() {
  auto run_dir = RunDirectory::create(config_);
  if (!run_dir) {
    if (!config_.log_dir.empty()) return usage_error(run_dir.error().message);
    spdlog::error("{}", run_dir.error().message);
    return kExitFailure;
  }
  run_dir_ = std::move(*run_dir);
  StallSettings stall = config_.stall;
  if (auto it = inherited_.find(kInitBarrierVariable);
      it != inherited_.end() && it->second == "0" && stall.init_timeout > 0) {
    stall.torch_init_barrier = false;
    spdlog::info(
        "{}=0: torch 2.x runs no init barrier, so --init-timeout waits for every rank to "
        "publish its process-group address instead",
        kInitBarrierVariable);
  }
  watch_ =
      std::make_unique<StallWatch>(io_, stall, host_, run_dir_->runtime_dir(), config_.node_name);
  add_supervision_env(*plan_, run_dir_->runtime_dir(), config_.stall.collective_timeout > 0,
                      inherited_);
  group_ = std::make_unique<WorkerGroup>(io_, control_, *plan_, config_, inherited_);
  // --timeout: one deadline for the whole job, across rounds and restarts.
  if (config_.job_timeout > 0) {
    job_deadline_ = std::make_unique<boost::asio::steady_timer>(
        io_, std::chrono::milliseconds(static_cast<long>(config_.job_timeout * 1000)));
    job_deadline_->async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      timed_out_ = true;
      group_->request_stop(fmt::format("the job ran past --timeout {} s", config_.job_timeout),
                           kExitJobTimeout);
    });
  }
  if (auto code = serve_metrics()) return *code;
  tell_other_nodes_of_failures_and_stalls();
  return std::nullopt;
}

std::optional<int> Launch::serve_metrics() {
  if (config_.metrics_port.empty()) return std::nullopt;
  auto listen = parse_listen_address(config_.metrics_port);
  if (!listen) return usage_error("--metrics-port " + listen.error().message);
  try {
    metrics_.emplace(io_, *listen, [this] {
      return render_node_metrics(
          node_metrics_now(group_->status(), attempt_, watch_->straggler_watch()));
    });
  } catch (const boost::system::system_error& error) {
    spdlog::error("--metrics-port {}: cannot listen there: {}", config_.metrics_port,
                  error.code().message());
    return kExitFailure;
  }
  const auto bound = metrics_->local_endpoint();  // Port 0 asked for any free one.
  spdlog::info("metrics: http://{}/metrics",
               Endpoint{bound.address().to_string(), bound.port(), ""}.text());
  return std::nullopt;
}

void Launch::draw_collectives(const std::string& title, const std::string& note,
                              const std::set<int>& missing) {
  // The picture is what a person opens first: it outlives the run.
  if (draw_collective_picture(watch_->straggler_watch(), run_dir_->path() / "collectives.html",
                              {title, std::nullopt, missing, note}))
    run_dir_->keep();
}

std::optional<int> Launch::join_round(int restart_count) {
  auto client = rendezvous_backend(io_, config_, std::move(rendezvous_));
  join_.restart_count = restart_count;
  spdlog::info("joining job '{}' at {} ({} node(s) expected, up to {} s)", config_.rdzv_id,
               config_.rdzv_endpoint, config_.nnodes, config_.join_timeout);
  // The daemon times the round out itself; our limit only covers a daemon that went silent.
  auto joined = client->join(
      join_,
      std::chrono::milliseconds(static_cast<long>(config_.join_timeout * 1000)) + kConnectTimeout);
  if (!joined) {
    spdlog::error("{}", joined.error().message);
    return client->job_closed() ? code_without_restart_ : kExitRendezvous;
  }
  const Assignment& assignment = *joined;
  place_in_job(*plan_, assignment);
  if (auto interface = interface_for_address(client->local_address()))
    set_socket_interface(*plan_, *interface, inherited_);
  spdlog::info("node rank {} of {}: ranks {}-{} of {}, MASTER_ADDR={} MASTER_PORT={}",
               assignment.group_rank, assignment.group_world_size, assignment.rank_offset,
               assignment.rank_offset + static_cast<int>(plan_->slots.size()) - 1,
               assignment.world_size, assignment.master_addr, assignment.master_port);
  rendezvous_ = std::move(client);

  membership_change_ = false;
  rendezvous_->watch(peer_events());
  return std::nullopt;
}

std::optional<int> Launch::run_preflight() {
  if (config_.preflight == LaunchConfig::Preflight::kOff) return std::nullopt;
  in_preflight_ = true;
  const PreflightOutcome outcome = run_preflight_check(
      {io_, config_, *plan_, inherited_, config_.node_name.empty() ? host_ : config_.node_name,
       *group_, *run_dir_, store_.get(), *watch_, summary_, timed_out_, peer_preflight_verdict_});
  in_preflight_ = false;
  if (outcome.judged_failed) {
    if (rendezvous_)
      rendezvous_->report_failure("the preflight failed on " + host_, kExitPreflightFailed,
                                  outcome.verdict);
    serve_remaining_nodes(kFailurePassOnTimeout);
  }
  return outcome.exit_code;
}

bool Launch::serve_store_if_master() {
  if (plan_->job.group_rank != 0) {
    watch_->observe_store(nullptr);
    store_.reset();
    return true;
  }
  if (store_) {
    // Each attempt gets a store of its own, as torch 2.x expects (its env:// keys carry no
    // attempt number): nothing of the last one's (gloo addresses, counters) may leak.
    store_->reset();
    return true;
  }
  return open_store();
}

bool Launch::open_store() {
  auto acceptor = store_acceptor(io_, plan_->job.master_addr, plan_->job.master_port, reservation_);
  if (!acceptor) {
    spdlog::error("{}", acceptor.error().message);
    return false;
  }
  store_ = std::make_unique<TcpStoreServer>(io_, std::move(*acceptor), watch_->store_observer());
  watch_->observe_store(store_.get());
  // Every rank connects at once at init_process_group: a backlog below that drops connects.
  const auto world_size = static_cast<size_t>(plan_->job.world_size);
  const auto connections =
      world_size * static_cast<size_t>(store_connections_per_rank(config_, *plan_));
  if (auto warning = connection_limits_warning(
          fmt::format("the job store for {} ranks", world_size), connections, kListenBacklog,
          host_connection_limits(descriptor_limit_)))
    spdlog::warn("{}", *warning);
  return true;
}

std::optional<int> Launch::conclude(const AttemptResult& result, int attempt, int& restart_count) {
  switch (result.end) {
    case AttemptResult::End::kSucceeded:
      if (rendezvous_) rendezvous_->report_done();
      serve_remaining_nodes(kHostExitBarrierTimeout);
      return kExitSuccess;
    case AttemptResult::End::kStalled:
      return conclude_stall(result, attempt, restart_count);
    case AttemptResult::End::kPeerStopped:
      if (timed_out_) {
        spdlog::error("stopped every worker: {}", result.peer_reason);
        if (rendezvous_)
          rendezvous_->report_failure("the job timed out on " + host_, kExitJobTimeout);
        return kExitJobTimeout;
      }
      if (membership_change_) {  // Scaling up is not a failure and spends no restart.
        spdlog::warn("{}", result.peer_reason);
        --restart_count;
        return std::nullopt;
      }
      spdlog::error("stopped this node's workers: {}", result.peer_reason);
      // Another node ended the round: that node's host serves the others, not this one.
      return end_or_restart(result.peer_exit_code, restart_count, "with the other nodes", false);
    case AttemptResult::End::kInterrupted:
      if (config_.under_slurm && result.interrupt_signal == SIGTERM) return cancelled_by_slurm();
      return exit_code_for_signal(result.interrupt_signal);
    case AttemptResult::End::kSpawnFailed:
      spdlog::error("cannot start a worker: {}", result.spawn_error);
      return kExitFailure;
    case AttemptResult::End::kWorkerFailed:
      // Slurm signals every process of the step: a worker may die of its SIGTERM before mcprun
      // handles its own.
      if (config_.under_slurm &&
          exit_code_for(result.workers[result.first_failure]) == exit_code_for_signal(SIGTERM))
        return cancelled_by_slurm();
      break;
  }
  report_worker_failure(node_facts(), result, run_dir_->attempt(attempt), restart_count, last_seen_,
                        *watch_, summary_);
  return end_or_restart(exit_code_for(result.workers[result.first_failure]), restart_count, "",
                        true);
}

std::optional<int> Launch::conclude_stall(const AttemptResult& result, int attempt,
                                          int restart_count) {
  // The other nodes sent their ranks before dumping stacks; a node that died says nothing.
  const size_t other_nodes = static_cast<size_t>(plan_->job.group_world_size - 1);
  run_until(
      io_, [&] { return reported_nodes_.size() >= other_nodes; }, kStallReportTimeout);
  run_dir_->keep();
  report_stall(node_facts(), result, run_dir_->attempt(attempt), *watch_, summary_);
  return end_or_restart(kExitStalled, restart_count, "after the stall", true);
}

std::optional<int> Launch::end_or_restart(int code, int restart_count, std::string_view how,
                                          bool serve_others) {
  code_without_restart_ = code;
  if (restart_count >= config_.max_restarts || job_closed()) {
    if (serve_others) serve_remaining_nodes(kFailurePassOnTimeout);
    return code_without_restart_;
  }
  spdlog::warn("restarting the worker group {}{}({} of {} restarts)", how, how.empty() ? "" : " ",
               restart_count + 1, config_.max_restarts);
  return std::nullopt;
}

int Launch::cancelled_by_slurm() {
  spdlog::error(
      "cancelled by Slurm (SIGTERM: scancel, the time limit or preemption): stopped "
      "every worker on {}; exit {}",
      host_, static_cast<int>(kExitSlurmCancelled));
  if (rendezvous_)
    rendezvous_->report_failure("Slurm cancelled the job on " + host_, kExitSlurmCancelled);
  return kExitSlurmCancelled;
}

bool Launch::job_closed() {
  if (!rendezvous_) return false;
  rendezvous_->await_failure_noted(
      kFailurePassOnTimeout);  // When this node's failure ended the round.
  io_.poll();                  // The word on a round another node ended came with that end.
  if (!rendezvous_->job_closed()) return false;
  spdlog::error("rendezvous: {}", *rendezvous_->job_closed());
  return true;
}

void Launch::serve_remaining_nodes(std::chrono::seconds limit) {
  if (embedded_)
    run_until(
        io_, [&] { return embedded_->job_finished(config_.rdzv_id); }, limit);
}

}  // namespace mcprun
