#include "launcher/watch/stall_watch.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "common/logging.hpp"
#include "common/proc_sockets.hpp"
#include "common/process_state.hpp"

namespace mcprun {
namespace {

/// A rank's state as its records tell it, led by why its process cannot run where /proc says so
/// (this node owns the process): that replaces the records' guess about a silent reporter.
std::string with_run_state(pid_t pid, std::string state) {
  const auto run_state = read_run_state(pid);
  const auto not_running = run_state ? describe_not_running(*run_state) : std::nullopt;
  if (!not_running) return state;
  if (const size_t at = state.find(kSilentReporterGuess); at != std::string::npos)
    state.erase(at, kSilentReporterGuess.size());
  return *not_running + "; " + state;
}

using Clock = std::chrono::steady_clock;

Clock::duration seconds(double value) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(value));
}

double seconds_since(Clock::time_point then) {
  return std::chrono::duration<double>(Clock::now() - then).count();
}

std::string format_seconds(double value) { return fmt::format("{:g} s", value); }

}  // namespace

StallWatch::StallWatch(boost::asio::io_context& io, StallSettings settings, std::string host,
                       const std::filesystem::path& runtime_dir, std::string node)
    : io_(io),
      settings_(settings),
      host_(std::move(host)),
      file_timer_(io, timer_file_in(runtime_dir),
                  [this](const ExpiredTimer& expired) { on_timer_expired(expired); }),
      channel_(io, agent_socket_in(runtime_dir),
               {[this](int rank) { on_heartbeat(rank); },
                [this](int rank, const std::string& name, double timeout_s) {
                  on_barrier(rank, name, timeout_s);
                }}),
      init_deadline_(io),
      activity_deadline_(io),
      collective_check_(io),
      links_(io, node.empty() ? host_ : std::move(node)) {}

StallWatch::~StallWatch() { end_attempt(); }

TcpStoreServer::Listener StallWatch::store_observer() {
  return [this](const StoreEvent& event) { on_store_event(event); };
}

void StallWatch::begin_attempt(int world_size, int master_port, StallHooks hooks) {
  end_attempt();
  armed_ = true;
  world_size_ = world_size;
  master_port_ = master_port;
  hooks_ = std::move(hooks);
  attempt_start_ = Clock::now();
  // The init deadline is armed by the first rank to reach the store (on_store_event).
  if (observed_store_ && settings_.init_timeout > 0)
    init_.emplace(world_size, settings_.torch_init_barrier);
  // Every rank's reporter writes to this node's store: the whole job is judged here.
  if (observed_store_ && settings_.collective_timeout > 0) {
    collectives_.emplace(settings_.collective_timeout, kProgressIntervalSeconds, attempt_start_);
    if (settings_.stragglers.window_s > 0) {
      stragglers_.emplace(settings_.stragglers);
      if (bandwidth_floor_)
        stragglers_->bandwidth().set_floor(bandwidth_floor_->first, bandwidth_floor_->second);
    }
    arm_collective_check();
  }
  arm_activity_deadline();
}

void StallWatch::arm_init_deadline() {
  init_deadline_.expires_after(seconds(settings_.init_timeout));
  init_deadline_.async_wait([this](boost::system::error_code ec) {
    if (!ec) on_init_deadline();
  });
}

void StallWatch::end_attempt() {
  armed_ = stalled_ = false;
  init_.reset();
  init_deadline_.cancel();
  activity_deadline_.cancel();
  collective_check_.cancel();
  links_.cancel();
  collectives_.reset();  // A new attempt starts with fresh progress state.
  if (stragglers_) {
    last_stragglers_ = stragglers_->episodes();
    last_slow_collectives_ = stragglers_->bandwidth().episodes();
  }
  stragglers_.reset();
  last_heartbeat_.clear();
  barriers_.clear();
  hooks_ = {};
}

void StallWatch::declare(StallNotice notice) {
  if (!armed_ || stalled_) return;
  stalled_ = true;  // One stall per attempt: the first explains the rest.
  notice.noticed_on = host_;
  init_deadline_.cancel();
  activity_deadline_.cancel();
  collective_check_.cancel();
  hooks_.on_stall(notice);
}

void StallWatch::on_store_event(const StoreEvent& event) {
  if (event.kind == StoreEvent::Kind::kSet && event.key.starts_with(kProgressKeyPrefix))
    return on_progress_record(event.key);
  if (!init_ || init_->passed()) return;
  const bool first_arrival = !init_->any_connected();
  init_->observe(event);
  // The world has --init-timeout from the first rank's arrival, however long it took to get
  // there: importing torch on a loaded box, or a script that never uses env:// init, is no stall,
  // and a rank arriving just after an early one still gets the whole timeout.
  if (first_arrival && init_->any_connected()) {
    spdlog::debug(
        "rank traffic on the job store after {:.2f} s; the init barrier is due within "
        "--init-timeout {}",
        seconds_since(attempt_start_), format_seconds(settings_.init_timeout));
    arm_init_deadline();
  }
  if (init_->passed()) {
    init_deadline_.cancel();
    spdlog::debug("all {} ranks passed the init barrier after {:.2f} s", world_size_,
                  seconds_since(attempt_start_));
  }
}

void StallWatch::on_progress_record(const std::string& key) {
  if (!collectives_ || !observed_store_ || stalled_) return;
  const std::string* text = observed_store_->value(key);
  if (!text) return;
  auto record = parse_progress_record(*text);
  if (!record) {  // Whoever can reach the store can write there: never trusted, never fatal.
    spdlog::debug("job store key {}: {}", key, record.error().message);
    return;
  }
  if (stragglers_)
    stragglers_->observe(*record,
                         std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count(),
                         Clock::now());
  collectives_->observe(std::move(*record), Clock::now());
}

void StallWatch::arm_collective_check() {
  collective_check_.expires_after(seconds(kProgressIntervalSeconds));
  collective_check_.async_wait([this](boost::system::error_code ec) {
    if (!ec) on_collective_check();
  });
}

void StallWatch::on_collective_check() {
  if (!armed_ || stalled_ || !collectives_) return;
  if (hooks_.workers)
    for (const WorkerStatus& worker : hooks_.workers()) {
      if (worker.pid > 0 && !worker.running)
        collectives_->rank_ended(worker.rank, worker.ended);
      else if (auto activity = worker.pid > 0 ? read_process_activity(worker.pid) : std::nullopt)
        collectives_->observe_kernel(worker.rank, worker.pid, *activity, Clock::now());
    }
  auto stall = collectives_->check(Clock::now());
  if (!stall) {
    check_stragglers();
    return arm_collective_check();
  }
  if (hooks_.workers)
    for (const WorkerStatus& worker : hooks_.workers())
      if (auto state = stall->states.find(worker.rank);
          state != stall->states.end() && worker.running)
        state->second = with_run_state(worker.pid, state->second);
  StallNotice notice;
  notice.kind = StallNotice::Kind::kCollective;
  notice.what = fmt::format(
      "{} made no progress for --collective-timeout {}: no collective "
      "completed on any rank and no rank outside it was busy",
      describe(stall->collective), format_seconds(settings_.collective_timeout));
  notice.collective = std::move(*stall);
  declare(std::move(notice));
}

void StallWatch::check_stragglers() {
  if (!stragglers_) return;
  std::vector<std::string> lines;
  // The collectives first: a rank late because its collective crawls is that collective's case.
  const auto cpu_wait_share = [this](const std::vector<int>& ranks) {
    return stragglers_->cpu_wait_share(ranks);
  };
  if (auto line = stragglers_->bandwidth().check(Clock::now(), std::chrono::system_clock::now(),
                                                 cpu_wait_share))
    lines.push_back(std::move(*line));
  if (auto line = stragglers_->check(Clock::now(), std::chrono::system_clock::now())) {
    // A straggler starved of CPU on this node: name what takes the CPU it may use.
    if (const StragglerEpisode* straggler = stragglers_->current();
        straggler && straggler->cause.starts_with("starved of CPU") && straggler->host == host_)
      if (auto hog = busiest_process_beside(straggler->cause_pid))
        *line += "; busiest beside it: " + *hog;
    lines.push_back(std::move(*line));
  }
  for (const std::string& line : lines) {
    spdlog::warn("{}", line);
    if (hooks_.on_straggler_line) hooks_.on_straggler_line(line);
    if (line.starts_with("slow collective:")) check_links();
  }
}

void StallWatch::check_links() {
  if (!armed_ || !hooks_.workers) return;
  auto ranks = [this] {
    std::map<int, pid_t> running;
    for (const WorkerStatus& worker : hooks_.workers())
      if (worker.running && worker.pid > 0) running[worker.rank] = worker.pid;
    return running;
  };
  links_.start(ranks, master_port_, [this](const std::string& line) {
    spdlog::warn("{}", line);
    if (hooks_.on_straggler_line) hooks_.on_straggler_line(line);
  });
}

std::map<int, std::chrono::system_clock::time_point> StallWatch::exiting_ranks() const {
  return collectives_ ? collectives_->exiting_at()
                      : std::map<int, std::chrono::system_clock::time_point>{};
}

std::vector<StragglerEpisode> StallWatch::stragglers() const {
  return stragglers_ ? stragglers_->episodes() : last_stragglers_;
}

std::vector<SlowCollective> StallWatch::slow_collectives() const {
  return stragglers_ ? stragglers_->bandwidth().episodes() : last_slow_collectives_;
}

std::map<int, std::string> StallWatch::ranks_in_collectives() const {
  return collectives_ ? collectives_->ranks_in_collectives(Clock::now())
                      : std::map<int, std::string>{};
}

void StallWatch::on_init_deadline() {
  if (!init_ || init_->passed()) return;
  StallNotice notice;
  notice.kind = StallNotice::Kind::kInit;
  notice.what = "the process group's init barrier was not passed within --init-timeout " +
                format_seconds(settings_.init_timeout) + " of the first rank's arrival";
  notice.arrived = init_->arrived();
  declare(std::move(notice));
}

void StallWatch::on_heartbeat(int rank) {
  if (!armed_) return;
  const bool first = !last_heartbeat_.contains(rank);
  last_heartbeat_[rank] = Clock::now();
  if (first) arm_activity_deadline();  // A new deadline, maybe earlier than the armed one.
}

void StallWatch::arm_activity_deadline() {
  if (!armed_ || stalled_ || !hooks_.workers) return;
  std::optional<Clock::time_point> earliest;
  auto consider = [&](Clock::time_point deadline) {
    if (!earliest || deadline < *earliest) earliest = deadline;
  };
  for (const WorkerStatus& worker : hooks_.workers()) {
    if (!worker.running) continue;
    if (auto beat = last_heartbeat_.find(worker.rank);
        beat != last_heartbeat_.end() && settings_.heartbeat_timeout > 0)
      consider(beat->second + seconds(settings_.heartbeat_timeout));
    if (settings_.silence_timeout > 0)
      consider(worker.last_output + seconds(settings_.silence_timeout));
  }
  // Workers not started yet (or none watched so far): look again after the silence limit.
  if (!earliest && settings_.silence_timeout > 0)
    earliest = Clock::now() + seconds(settings_.silence_timeout);
  if (!earliest) return;
  activity_deadline_.expires_at(*earliest);
  activity_deadline_.async_wait([this](boost::system::error_code ec) {
    if (!ec) on_activity_deadline();
  });
}

void StallWatch::on_activity_deadline() {
  if (!armed_ || stalled_) return;
  const auto now = Clock::now();
  for (const WorkerStatus& worker : hooks_.workers()) {
    if (!worker.running) continue;
    StallNotice notice;
    notice.rank = worker.rank;
    if (auto beat = last_heartbeat_.find(worker.rank);
        beat != last_heartbeat_.end() && settings_.heartbeat_timeout > 0 &&
        now >= beat->second + seconds(settings_.heartbeat_timeout)) {
      notice.kind = StallNotice::Kind::kHeartbeat;
      notice.what = fmt::format("rank {} sent no heartbeat for --heartbeat-timeout {}", worker.rank,
                                format_seconds(settings_.heartbeat_timeout));
    } else if (settings_.silence_timeout > 0 &&
               now >= worker.last_output + seconds(settings_.silence_timeout)) {
      notice.kind = StallNotice::Kind::kSilence;
      notice.what = fmt::format("rank {} printed nothing for --silence-timeout {}", worker.rank,
                                format_seconds(settings_.silence_timeout));
    } else {
      continue;
    }
    return declare(std::move(notice));
  }
  arm_activity_deadline();
}

void StallWatch::on_barrier(int rank, const std::string& name, double timeout_s) {
  if (!armed_) return;
  Barrier& barrier = barriers_[name];
  barrier.arrived.insert(rank);
  if (!barrier.deadline && timeout_s > 0) {
    // The first local arrival starts the clock; a node with no rank there has none running.
    barrier.timeout_s = timeout_s;
    barrier.deadline = std::make_unique<boost::asio::steady_timer>(io_, seconds(timeout_s));
    barrier.deadline->async_wait([this, name](boost::system::error_code ec) {
      if (ec) return;
      StallNotice notice;
      notice.kind = StallNotice::Kind::kBarrier;
      notice.barrier = name;
      notice.what = fmt::format("barrier '{}' was not complete within its timeout of {}", name,
                                format_seconds(barriers_[name].timeout_s));
      declare(std::move(notice));
    });
  }
  if (hooks_.forward_barrier_arrival) return hooks_.forward_barrier_arrival(name, rank);
  if (static_cast<int>(barrier.arrived.size()) >= world_size_) complete_barrier(name);
}

void StallWatch::complete_barrier(const std::string& name) {
  barriers_.erase(name);  // Cancels its deadline; the name may be used again.
  channel_.complete_barrier(name);
}

void StallWatch::on_timer_expired(const ExpiredTimer& expired) {
  if (!armed_ || !hooks_.workers) return;
  for (const WorkerStatus& worker : hooks_.workers()) {
    if (worker.pid != expired.pid) continue;
    StallNotice notice;
    notice.kind = StallNotice::Kind::kTimer;
    notice.rank = worker.rank;
    notice.what =
        fmt::format("rank {}'s FileTimer scope '{}' expired", worker.rank, expired.scope_id);
    return declare(std::move(notice));
  }
  spdlog::warn("FileTimer scope '{}' of pid {} expired; that pid is no worker of this node",
               expired.scope_id, expired.pid);
}

std::vector<RankProgress> StallWatch::diagnose(const StallNotice& notice,
                                               const std::vector<WorkerStatus>& workers) const {
  std::vector<RankProgress> ranks;
  for (const WorkerStatus& worker : workers) {
    RankProgress progress;
    progress.rank = worker.rank;
    progress.local_rank = worker.local_rank;
    progress.host = host_;
    progress.pid = worker.pid;
    progress.last_line = worker.last_line;
    if (worker.pid > 0) progress.last_line_age_s = seconds_since(worker.last_output);
    progress.stack_file = worker.running ? worker.stack_file.string() : "";
    if (worker.pid == 0) {
      progress.level = RankProgress::kNotRunning;
      progress.state = "never started";
    } else if (!worker.running) {
      progress.level = RankProgress::kNotRunning;
      progress.state = "ended early: " + worker.ended;
    } else if (notice.kind == StallNotice::Kind::kInit) {
      const std::vector<SocketEnd> ends = connections_to_port(worker.pid, master_port_);
      bool arrived = false, unknown = false;
      for (const SocketEnd& end : ends) {
        if (auto ports = notice.arrived.find(end.address); ports != notice.arrived.end())
          arrived |= std::find(ports->second.begin(), ports->second.end(), end.port) !=
                     ports->second.end();
        else
          unknown |= notice.arrived_left_out > 0;  // Its host's arrivals did not fit the notice.
      }
      progress.level = arrived        ? RankProgress::kArrived
                       : ends.empty() ? RankProgress::kNotConnected
                                      : RankProgress::kConnected;
      progress.state = arrived        ? "at the init barrier"
                       : ends.empty() ? "never connected to the store"
                       : unknown      ? "connected; at the init barrier or not, the notice did "
                                        "not say (its host's arrivals did not fit it)"
                                      : "connected, not at the init barrier";
    } else if (notice.kind == StallNotice::Kind::kBarrier) {
      auto barrier = barriers_.find(notice.barrier);
      const bool arrived =
          barrier != barriers_.end() && barrier->second.arrived.contains(worker.rank);
      progress.level = arrived ? RankProgress::kArrived : RankProgress::kConnected;
      progress.state = arrived ? "at barrier '" + notice.barrier + "'"
                               : "never reached barrier '" + notice.barrier + "'";
    } else if (notice.kind == StallNotice::Kind::kCollective && notice.collective) {
      const CollectiveStall& stall = *notice.collective;
      const bool missing =
          std::find(stall.missing.begin(), stall.missing.end(), worker.rank) != stall.missing.end();
      progress.level = missing ? RankProgress::kConnected : RankProgress::kArrived;
      auto state = stall.states.find(worker.rank);
      progress.state =
          with_run_state(worker.pid, state != stall.states.end() ? state->second : "running");
    } else if (notice.rank == worker.rank) {
      progress.level = RankProgress::kConnected;
      progress.state = notice.kind == StallNotice::Kind::kTimer ? "its FileTimer scope expired"
                       : notice.kind == StallNotice::Kind::kHeartbeat ? "stopped heartbeating"
                                                                      : "went silent";
    } else {
      progress.level = RankProgress::kArrived;
      progress.state = "running";
    }
    ranks.push_back(std::move(progress));
  }
  return ranks;
}

}  // namespace mcprun
