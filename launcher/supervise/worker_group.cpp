#include "launcher/supervise/worker_group.hpp"

#include <signal.h>

#include <boost/asio/post.hpp>
#include <fstream>

#include "common/event_loop.hpp"
#include "common/exit_status.hpp"
#include "common/logging.hpp"
#include "common/sys.hpp"

namespace mcprun {
namespace {

/// An attempt lasts as long as the job does: supervising it has no limit of ours (--timeout is
/// the job's own, and arrives as a stop request).
constexpr std::chrono::hours kNoAttemptLimit{24 * 365};
/// Beyond the dumpers' own limits: time for the last one's exit to reach the loop.
constexpr std::chrono::seconds kDumpBatchSlack{1};

/// Adds the Python tracebacks faulthandler printed to a rank's stack dump file.
void append_tracebacks(const std::filesystem::path& stack_file,
                       const std::vector<std::string>& lines) {
  std::ofstream out(stack_file, std::ios::app);
  out << "\n=== Python tracebacks (faulthandler, on SIGABRT) ===\n";
  for (const std::string& line : lines) out << line << "\n";
}

}  // namespace

WorkerGroup::WorkerGroup(boost::asio::io_context& io, ProcessControl& control, const RankPlan& plan,
                         const LaunchConfig& config, const Environment& inherited)
    : io_(io),
      control_(control),
      plan_(plan),
      config_(config),
      inherited_(inherited),
      signals_(io, SIGCHLD),
      dumper_(io, control),
      python_tracebacks_(!inherited.contains("PYTHONFAULTHANDLER") ||
                         !inherited.at("PYTHONFAULTHANDLER").empty()) {
  // --signals-to-handle; any other signal keeps its default action, as under torchrun, except
  // SIGUSR1/2: a preemption warning that killed the launcher would lose the checkpoint it asks for.
  for (int signal : config.signals_to_handle) signals_.add(signal);
  for (int signal : {SIGUSR1, SIGUSR2})
    if (!config.signals_to_handle.contains(signal)) signals_.add(signal);
  if (stdout_console_.is_terminal() || stderr_console_.is_terminal()) signals_.add(SIGWINCH);
  wait_for_signals();
  // A control without SIGCHLD (a test's fake) says when a process ended; the reap runs on the loop.
  control_.set_exit_listener([this, alive = std::weak_ptr<bool>(alive_)] {
    boost::asio::post(io_, [this, alive] {
      if (!alive.expired()) on_child_exits();
    });
  });
}

WorkerGroup::~WorkerGroup() { control_.set_exit_listener({}); }

void WorkerGroup::wait_for_signals() {
  signals_.async_wait([this](boost::system::error_code ec, int signal) {
    if (ec) return;
    on_signal(signal);
    wait_for_signals();
  });
}

void WorkerGroup::on_signal(int signal) {
  if (signal == SIGCHLD) return on_child_exits();
  if (signal == SIGWINCH) return on_window_change();
  if (forwarded_only(signal)) {  // SIGUSR1/2: the workers' business (a checkpoint), not ours.
    spdlog::info("received {}, forwarding it to every worker", signal_name(signal));
    signal_all(signal);
    return;
  }
  if (stopping_) {
    escalate_ = true;
    return;
  }
  spdlog::warn("received {}, forwarding it to every worker and stopping the group",
               signal_name(signal));
  signal_all(signal);
  interrupt_signal_ = signal;
}

void WorkerGroup::on_child_exits() {
  for (const ProcessExit& exit : control_.reap()) {
    for (size_t i = 0; i < workers_.size(); ++i) {
      Worker& worker = workers_[i];
      if (worker.pid != exit.pid || !worker.running) continue;
      worker.running = false;
      worker.outcome.exit_code = exit.exit_code;
      worker.outcome.signal = exit.signal;
      worker.outcome.exit_time = std::chrono::system_clock::now();
      // Once we began stopping, a signal death or a clean exit is our doing; an exit code of
      // its own (the same crash landing a moment later) still counts as its own failure.
      worker.outcome.stopped_by_launcher = (stopping_ || interrupt_signal_ != 0) &&
                                           (exit.signal != 0 || exit.exit_code == 0 ||
                                            exit.exit_code == exit_code_for_signal(SIGTERM));
      // After another node's stop request, local deaths are its consequence, not a root cause.
      if (!exit.succeeded() && !worker.outcome.stopped_by_launcher && !first_failure_ &&
          !peer_stop_ && !stall_) {
        first_failure_ = i;
        if (failure_listener_) failure_listener_(worker.outcome);
      }
    }
  }
}

void WorkerGroup::on_window_change() {
  auto size = stdout_console_.window_size();
  if (!size) size = stderr_console_.window_size();
  if (!size) return;
  for (const Worker& worker : workers_) {
    if (!worker.output->on_terminal()) continue;
    worker.output->resize(*size);
    if (worker.running) control_.signal_group(worker.pid, SIGWINCH);
  }
}

void WorkerGroup::signal_all(int signal) {
  // Exited leaders too: their group may still hold grandchildren.
  for (const Worker& worker : workers_)
    if (worker.pid > 0) control_.signal_group(worker.pid, signal);
  control_.signal_orphans(signal);
}

size_t WorkerGroup::running_count() const {
  size_t count = 0;
  for (const Worker& worker : workers_) count += worker.running;
  return count;
}

bool WorkerGroup::run_until(const std::function<bool()>& done,
                            std::chrono::steady_clock::duration limit) {
  mcprun::run_until(
      io_, [&] { return done() || escalate_; }, limit);
  return done();
}

void WorkerGroup::stop_all(int soft_signal, bool already_delivered) {
  stopping_ = true;
  auto nothing_left = [this] { return !control_.has_children(); };
  if (nothing_left()) return;
  if (!already_delivered) signal_all(soft_signal);
  signal_all(SIGCONT);  // A stopped worker (SIGSTOP, a stuck debugger) can then act on it.
  const auto grace = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(config_.term_timeout));
  if (run_until(nothing_left, grace)) return;
  spdlog::warn("{} worker(s) still running after {}; sending SIGKILL", running_count(),
               escalate_ ? "a second interrupt" : std::to_string(config_.term_timeout) + " s");
  escalate_ = false;
  signal_all(SIGKILL);
  if (!run_until(nothing_left, kKillReapTimeout))
    spdlog::error("some processes could not be reaped within {} s", kKillReapTimeout.count());
}

void WorkerGroup::request_stop(std::string reason, int exit_code) {
  if (!peer_stop_) peer_stop_.emplace(std::move(reason), exit_code);
}

void WorkerGroup::request_stall(StallNotice notice) {
  if (!stall_ && !stopping_) stall_ = std::move(notice);
}

std::vector<WorkerStatus> WorkerGroup::status() const {
  std::vector<WorkerStatus> statuses;
  for (const Worker& worker : workers_) {
    WorkerStatus status;
    status.rank = worker.slot->identity.rank;
    status.local_rank = worker.slot->identity.local_rank;
    status.pid = worker.pid;
    status.running = worker.running;
    if (worker.pid > 0 && !worker.running)
      status.ended = describe_exit(worker.outcome.exit_code, worker.outcome.signal);
    if (!worker.output->tail().empty())
      status.last_line = printable_text(worker.output->tail().back());
    status.last_output = worker.output->last_output();
    status.stack_file = worker.stack_file;
    statuses.push_back(std::move(status));
  }
  return statuses;
}

void WorkerGroup::dump_stalled_workers() {
  if (!config_.stack_dumps)
    for (Worker& worker : workers_) worker.stack_file.clear();
  if (stall_listener_) stall_listener_(*stall_, status());
  if (!config_.stack_dumps) return;  // Stop at once: no dumps of any kind.
  await_flight_recorder_dumps();
  std::vector<StackDumpRequest> requests;
  for (const Worker& worker : workers_)
    if (worker.running) requests.push_back({worker.pid, worker.stack_file});
  bool dumped = false;
  dumper_.dump_all(requests, kStackDumpTimeout, [&dumped] { dumped = true; });
  run_until([&] { return dumped; }, kStackDumpTimeout + kDumperKillTimeout + kDumpBatchSlack);

  // faulthandler (PYTHONFAULTHANDLER) prints every thread's Python traceback on SIGABRT.
  stopping_ = true;
  for (Worker& worker : workers_) {
    if (!worker.running || !python_tracebacks_) continue;
    worker.output->copy_stderr_to(&worker.tracebacks);
    control_.signal_group(worker.pid, SIGCONT);
    control_.signal_process(worker.pid, SIGABRT);
  }
  if (python_tracebacks_) run_until([this] { return running_count() == 0; }, kTracebackTimeout);
}

void WorkerGroup::await_flight_recorder_dumps() {
  const auto& collective = stall_->collective;
  if (stall_->kind != StallNotice::Kind::kCollective || !collective ||
      collective->source == "stack")
    return;  // torch 1.x has no Flight Recorder.
  const auto prefix = flight_recorder_prefix(attempt_dir_).string();
  std::filesystem::create_directories(flight_recorder_prefix(attempt_dir_).parent_path());
  run_until(
      [&] {
        for (const Worker& worker : workers_)
          if (worker.running &&
              !std::filesystem::exists(prefix + std::to_string(worker.slot->identity.rank)))
            return false;
        return true;
      },
      kFlightRecorderDumpTimeout);
}

AttemptResult WorkerGroup::run_attempt(int restart_count, const AttemptFiles& files,
                                       const StandIn* stand_in) {
  reset_attempt();
  AttemptResult result;
  prepare_workers(files);
  spawn_workers(restart_count, result, stand_in);
  if (result.end != AttemptResult::End::kSpawnFailed) supervise();
  stop_attempt();
  collect_outcomes(result);
  if (result.end != AttemptResult::End::kSpawnFailed) classify_ending(result);
  return result;
}

void WorkerGroup::reset_attempt() {
  workers_.clear();
  first_failure_.reset();
  peer_stop_.reset();
  stall_.reset();
  stopping_ = escalate_ = false;
}

void WorkerGroup::prepare_workers(const AttemptFiles& files) {
  const bool several_ranks = plan_.slots.size() > 1;
  attempt_dir_ = files.attempt_dir;
  workers_.reserve(plan_.slots.size());
  for (const RankSlot& slot : plan_.slots) {
    const int local_rank = slot.identity.local_rank;
    const auto rank_dir = files.attempt_dir / std::to_string(local_rank);
    std::filesystem::create_directories(rank_dir);
    const int redirect = config_.redirects.bits_for(local_rank),
              tee = config_.tee.bits_for(local_rank);
    const bool shown =
        !config_.local_ranks_filter || config_.local_ranks_filter->contains(local_rank);
    StreamRoute out{shown && (!(redirect & 1) || (tee & 1)),
                    files.keep_logs ? rank_dir / "stdout.log" : std::filesystem::path()};
    StreamRoute err{shown && (!(redirect & 2) || (tee & 2)),
                    files.keep_logs ? rank_dir / "stderr.log" : std::filesystem::path()};
    Worker& worker = workers_.emplace_back();
    worker.slot = &slot;
    worker.output = std::make_unique<RankOutput>(
        io_,
        console_prefix(config_.log_line_prefix_template, slot.identity.rank, local_rank,
                       plan_.job.role, several_ranks),
        out, err, stdout_console_, stderr_console_);
    worker.outcome.rank = slot.identity.rank;
    worker.outcome.local_rank = local_rank;
    worker.outcome.error_file = worker_error_file(rank_dir);
    worker.dir = rank_dir;
    worker.stack_file = rank_dir / "stacks.txt";
  }
}

void WorkerGroup::spawn_workers(int restart_count, AttemptResult& result, const StandIn* stand_in) {
  for (Worker& worker : workers_) {
    if (interrupt_signal_ != 0) break;
    const Environment delta =
        worker_spawn_delta(plan_, *worker.slot, restart_count, worker.dir, inherited_, stand_in);
    SpawnRequest request{stand_in ? stand_in->argv : plan_.argv,
                         merge_environment(inherited_, delta), worker.slot->cpus,
                         worker.output->child_stdout(), worker.output->child_stderr()};
    auto pid = control_.spawn(request);
    worker.output->close_child_ends();
    if (!pid) {
      result.end = AttemptResult::End::kSpawnFailed;
      result.spawn_error = pid.error().message;
      break;
    }
    worker.pid = *pid;
    worker.running = true;
    worker.outcome.pid = *pid;
    worker.output->start();
    spdlog::debug("started local rank {} as pid {}", worker.slot->identity.local_rank, *pid);
  }
}

void WorkerGroup::supervise() {
  run_until(
      [this] {
        return running_count() == 0 || first_failure_ || interrupt_signal_ != 0 || peer_stop_ ||
               stall_;
      },
      kNoAttemptLimit);
}

void WorkerGroup::stop_attempt() {
  if (stall_ && interrupt_signal_ == 0) dump_stalled_workers();
  // Whatever ended the attempt, nothing of it outlives it: not workers, not their grandchildren.
  if (interrupt_signal_ != 0)
    stop_all(interrupt_signal_, true);
  else
    stop_all(SIGTERM, false);
}

void WorkerGroup::collect_outcomes(AttemptResult& result) {
  run_until(
      [this] {
        for (const Worker& worker : workers_)
          if (!worker.output->drained()) return false;
        return true;
      },
      kOutputDrainTimeout);
  for (Worker& worker : workers_) {
    worker.output->copy_stderr_to(nullptr);
    if (!worker.tracebacks.empty()) append_tracebacks(worker.stack_file, worker.tracebacks);
    worker.output->finish();
    worker.outcome.tail = worker.output->tail();
    result.workers.push_back(worker.outcome);
  }
}

void WorkerGroup::classify_ending(AttemptResult& result) const {
  if (stall_ && interrupt_signal_ == 0) {
    result.end = AttemptResult::End::kStalled;
    result.stall = stall_;
  } else if (peer_stop_ && !first_failure_ && interrupt_signal_ == 0) {
    result.end = AttemptResult::End::kPeerStopped;
    result.peer_reason = peer_stop_->first;
    result.peer_exit_code = peer_stop_->second;
  } else if (interrupt_signal_ != 0) {
    result.end = AttemptResult::End::kInterrupted;
    result.interrupt_signal = interrupt_signal_;
  } else if (first_failure_) {
    result.end = AttemptResult::End::kWorkerFailed;
    result.first_failure = *first_failure_;
  }
}

}  // namespace mcprun
