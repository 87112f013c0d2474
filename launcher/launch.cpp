#include "launcher/launch.hpp"

#include <unistd.h>

#include <boost/asio/ip/v6_only.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>

#include "common/connection_limits.hpp"
#include "common/descriptor_limit.hpp"
#include "common/endpoint.hpp"
#include "common/event_loop.hpp"
#include "common/exit_status.hpp"
#include "common/expected.hpp"
#include "common/logging.hpp"
#include "common/protocol.hpp"
#include "common/sys.hpp"
#include "launcher/plan/descriptor_budget.hpp"
#include "launcher/supervise/failure_report.hpp"
#include "launcher/supervise/output_relay.hpp"
#include "launcher/commands/operator_command.hpp"
#include "launcher/stall/stall_report.hpp"
#include "launcher/store/torch_keys.hpp"
#include "rendezvousd/daemon_config.hpp"

namespace mcprun {

namespace {

/// A stall notice's share of its rendezvous frame; the rest is room for the type and the node
/// name the daemon adds when it relays it.
constexpr size_t kStallNoticeBytes = kMaxFrameBytes - 4096;

/// Each rank's output is also written to files in its run folder.
bool keeps_log_files(const LaunchConfig& config) {
  const bool streams_to_files = config.redirects.all || config.tee.all ||
                                !config.redirects.per_rank.empty() || !config.tee.per_rank.empty();
  return !config.log_dir.empty() || streams_to_files || config.nccl_debug;
}

}  // namespace

/// The run's folder: attempt_<n>/<local rank>/{stdout.log,stderr.log,error.json}. Under
/// --log-dir it is kept; otherwise it is a temp folder removed at exit unless logs were asked for.
class RunDirectory {
 public:
  static Expected<std::unique_ptr<RunDirectory>> create(const LaunchConfig& config) {
    std::filesystem::path parent = config.log_dir;
    if (parent.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      parent = tmp && *tmp ? tmp : "/tmp";
    }
    // A --log-dir is the user's input, named as such; TMPDIR's folder is mcprun's own choice.
    const std::string named = config.log_dir.empty() ? "" : "--log-dir " + config.log_dir + ": ";
    if (auto made = make_folders(parent); !made) return Error{named + made.error().message};
    std::string pattern = (parent / ("mcprun_" + config.rdzv_id + "_XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr)
      return Error{named + "cannot create a run folder in " + parent.string() + ": " +
                   std::strerror(errno)};
    const bool keep = keeps_log_files(config);
    if (keep) spdlog::info("logs of this run: {}", pattern);
    return std::unique_ptr<RunDirectory>(new RunDirectory(pattern, keep));
  }
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;
  ~RunDirectory() {
    std::error_code ec;
    if (!runtime_.empty()) std::filesystem::remove_all(runtime_, ec);
    if (!keep_) std::filesystem::remove_all(path_, ec);
  }
  AttemptFiles attempt(int restart_count) const {
    return {path_ / ("attempt_" + std::to_string(restart_count)), keep_};
  }
  const std::filesystem::path& path() const { return path_; }
  /// Keeps the folder after all: it holds a stall's report and stack dumps.
  void keep() {
    if (!keep_) spdlog::info("keeping this run's files: {}", path_.string());
    keep_ = true;
  }
  /// Where the FileTimer pipe and the helper's socket live: a unix socket path must stay short.
  std::filesystem::path runtime_dir() {
    if ((path_ / "agent.sock").string().size() < kUnixPathLimit) return path_;
    if (runtime_.empty()) {
      std::string pattern = "/tmp/mcprun_rt_XXXXXX";
      if (::mkdtemp(pattern.data()) != nullptr) runtime_ = pattern;
    }
    return runtime_;
  }

 private:
  RunDirectory(std::filesystem::path path, bool keep) : path_(std::move(path)), keep_(keep) {}

  static constexpr size_t kUnixPathLimit = 100;  ///< sun_path holds 108 bytes.
  std::filesystem::path path_;
  std::filesystem::path runtime_;
  bool keep_ = false;
};

namespace {

/// How long the node hosting the embedded rendezvous keeps serving after its own workers are
/// done, so the other nodes can report theirs (torchrun's exit barrier).
constexpr std::chrono::seconds kHostExitBarrierTimeout{60};

/// torchrun's is_host guess: the endpoint names this machine.
bool endpoint_is_local(const Endpoint& endpoint) {
  const std::string& host = endpoint.host;
  if (host == "localhost" || host == host_name()) return true;
  boost::system::error_code ec;
  auto address = boost::asio::ip::make_address(host, ec);
  if (ec) return false;
  return address.is_loopback() || interface_for_address(address.to_string()).has_value();
}

/// Hosts the rendezvous in-process when this node is the endpoint and nothing listens there yet.
std::unique_ptr<RendezvousServer> host_embedded_rendezvous(boost::asio::io_context& io,
                                                           const LaunchConfig& config) {
  // A unix socket or a malformed endpoint is never hosted here; the client says what is wrong.
  auto endpoint = parse_endpoint(config.rdzv_endpoint);
  if (!endpoint || !config.is_host.value_or(endpoint_is_local(*endpoint))) return nullptr;
  const int port = endpoint->port;
  try {
    auto server = std::make_unique<RendezvousServer>(
        io, boost::asio::ip::tcp::endpoint(boost::asio::ip::tcp::v4(), static_cast<unsigned short>(port)),
        ServerSettings{});
    spdlog::info("hosting the rendezvous for job '{}' on port {}", config.rdzv_id, port);
    return server;
  } catch (const boost::system::system_error& error) {
    // A rendezvousd already listens there (or another host agent): be its client instead.
    spdlog::debug("not hosting the rendezvous on port {}: {}", port, error.code().message());
    return nullptr;
  }
}

/// This node's pinned GPUs in local-rank order, as the rendezvous learns them with the join.
nlohmann::json gpu_topology(const RankPlan& plan) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const RankSlot& slot : plan.slots)
    if (const auto& gpu = slot.identity.gpu)
      gpus.push_back({{"local_rank", slot.identity.local_rank}, {"bus_id", gpu->bus_id},
                      {"numa_node", gpu->numa_node}, {"switch", gpu->switch_id()},
                      {"uuid", gpu->uuid}});
  return gpus;
}

/// How long a stalled node waits for the other nodes' views of their ranks.
constexpr std::chrono::seconds kStallReportTimeout{5};

/// How long the host of an embedded rendezvous keeps serving after a last failure or stall, so
/// that the other nodes hear of it before the server goes away.
constexpr std::chrono::seconds kFailurePassOnTimeout{2};

/// The python helper (import mcprun) next to the binary: <prefix>/share/mcprun/python, which
/// the build tree mirrors.
std::optional<std::filesystem::path> python_helper_dir() {
  const auto exe = self_executable();
  if (exe.empty()) return std::nullopt;
  std::error_code ec;
  auto dir = exe.parent_path().parent_path() / "share" / "mcprun" / "python";
  if (!std::filesystem::exists(dir / "mcprun" / "__init__.py", ec)) return std::nullopt;
  return dir;
}

/// What supervision adds for every worker: the watchdogs' files under `runtime_dir` and the
/// helper module on PYTHONPATH. A run and --dry-run both add them here.
void add_supervision_env(RankPlan& plan, const std::filesystem::path& runtime_dir,
                         const LaunchConfig& config, const Environment& inherited) {
  for (auto& [name, value] : StallWatch::worker_env(runtime_dir, config.stall))
    plan.extra_env[name] = value;
  if (auto helper = python_helper_dir()) {
    auto inherited_path = inherited.find("PYTHONPATH");
    plan.extra_env["PYTHONPATH"] =
        helper->string() + (inherited_path == inherited.end() ? "" : ":" + inherited_path->second);
  }
}

/// The job store's listening socket on MASTER_PORT: the socket mcprun reserved when it holds
/// that port, else a fresh bind (a --master-port the user chose). An IPv6 MASTER_ADDR
/// (--rdzv-endpoint [::1]:PORT) gets a dual-stack IPv6 socket, so its workers can connect.
Expected<boost::asio::ip::tcp::acceptor> store_acceptor(
    boost::asio::io_context& io, const std::string& master_addr, int port,
    std::optional<PortReservation>& reservation) {
  namespace ip = boost::asio::ip;
  ip::tcp::acceptor acceptor(io);
  boost::system::error_code ec;
  const bool ipv6 = master_addr.find(':') != std::string::npos;
  if (reservation && reservation->port() == port && !ipv6) {
    acceptor.assign(ip::tcp::v4(), reservation->take_socket().release(), ec);
    reservation.reset();
  } else {
    const ip::tcp protocol = ipv6 ? ip::tcp::v6() : ip::tcp::v4();
    acceptor.open(protocol, ec);
    if (!ec) acceptor.set_option(ip::tcp::acceptor::reuse_address(true), ec);
    if (!ec && ipv6) acceptor.set_option(ip::v6_only(false), ec);
    if (!ec) acceptor.bind({protocol, static_cast<unsigned short>(port)}, ec);
  }
  if (!ec) acceptor.listen(kListenBacklog, ec);
  if (ec)
    return Error{fmt::format("cannot serve the job store on MASTER_PORT {}: {}", port, ec.message())};
  return acceptor;
}

/// Points a failure or stall report at each rank's NCCL log, under --nccl-debug.
void name_nccl_logs(const LaunchConfig& config, const AttemptResult& result, const AttemptFiles& files) {
  if (!config.nccl_debug) return;
  std::fputs("NCCL debug logs (--nccl-debug):\n", stderr);
  for (const WorkerOutcome& worker : result.workers)
    std::fprintf(stderr, "  rank %d: %s\n", worker.rank,
                 nccl_log_pattern(files.attempt_dir / std::to_string(worker.local_rank)).c_str());
}

/// The rendezvousd that leases this box's GPUs: $MCPRUN_DAEMON (unix:PATH; empty: none), else
/// the service's socket when it exists.
std::optional<std::string> lease_endpoint(const Environment& inherited) {
  std::string endpoint = kDefaultDaemonEndpoint;
  if (auto chosen = inherited.find("MCPRUN_DAEMON"); chosen != inherited.end()) endpoint = chosen->second;
  auto parsed = parse_endpoint(endpoint, kConnectRules);
  if (!parsed || !parsed->is_unix()) {
    if (!endpoint.empty()) spdlog::warn("MCPRUN_DAEMON={}: GPU leases need unix:PATH; not leasing", endpoint);
    return std::nullopt;
  }
  std::error_code ec;
  if (!std::filesystem::exists(parsed->unix_path, ec)) return std::nullopt;
  return endpoint;
}

/// How many GPUs to lease: one per rank when ranks are pinned, all of them for -n gpu|auto.
int gpus_wanted(const LaunchConfig& config, const std::vector<GpuDevice>& gpus) {
  if (config.no_pin || gpus.empty()) return 0;
  if (config.nproc.kind == NprocSpec::Kind::kCount) return config.nproc.count;
  return config.nproc.kind == NprocSpec::Kind::kCpu ? 0 : static_cast<int>(gpus.size());
}

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
    collectives_at_end_ = watch_->ranks_in_collectives();  // Before end_attempt forgets them.
    if (!config_.log_dir.empty() && result.end != AttemptResult::End::kStalled)
      draw_collectives("end of the attempt", "", {});
    exiting_at_end_ = watch_->exiting_ranks();
    watch_->end_attempt();
    summary_.set_stragglers(watch_->stragglers());
    summary_.set_slow_collectives(watch_->slow_collectives());
    if (auto code = conclude(result, attempt, restart_count)) return *code;
  }
}

std::optional<int> Launch::lease_gpus(std::vector<GpuDevice>& gpus) {
  // On a shared box the local rendezvousd leases this job its GPUs and master port, for as long
  // as this connection lasts: two users' jobs never share either.
  auto endpoint = lease_endpoint(inherited_);
  if (!endpoint || config_.dry_run) return std::nullopt;
  lease_holder_ = std::make_unique<RendezvousClient>(io_, *endpoint);
  auto granted = lease_holder_->lease(
      {{"gpus", gpus_wanted(config_, gpus)}, {"wait_s", config_.gpu_wait}, {"job", config_.rdzv_id}},
      std::chrono::milliseconds(static_cast<long>(config_.gpu_wait * 1000)) + kConnectTimeout);
  if (!granted) {
    spdlog::error("no GPU lease from rendezvousd at {}: {}", *endpoint, granted.error().message);
    return kExitRendezvous;
  }
  const GrantedLease& lease = *granted;
  std::erase_if(gpus, [&](const GpuDevice& gpu) {
    return std::find(lease.gpus.begin(), lease.gpus.end(), gpu.bus_id) == lease.gpus.end();
  });
  spdlog::info("leased from rendezvousd: {} GPU(s), master port {}", lease.gpus.size(), lease.port);
  leased_port_ = lease.port;
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
    add_supervision_env(*plan_, kDryRunDir, config_, inherited_);
    std::cout << format_rank_plan(*plan_, inherited_);
    return kExitSuccess;
  }
  return std::nullopt;
}

std::optional<int> Launch::prepare_join() {
  if (!config_.uses_rendezvous()) return std::nullopt;
  if (config_.rdzv_backend == "c10d") embedded_ = host_embedded_rendezvous(io_, config_);
  join_ = {{"job", config_.rdzv_id},
           {"node", config_.node_name.empty() ? host_ + ":" + std::to_string(::getpid())
                                              : config_.node_name},
           {"nproc", plan_->slots.size()},
           {"master_port", plan_->job.master_port},
           {"node_rank", config_.node_rank.value_or(-1)},
           {"labels", config_.topology_labels},
           {"gpus", gpu_topology(*plan_)},
           {"min_nodes", config_.min_nodes},
           {"max_nodes", config_.max_nodes},
           {"join_timeout_s", config_.join_timeout},
           {"last_call_timeout_s", config_.last_call_timeout}};
  if (!config_.rdzv_token_file.empty()) {
    auto token = read_token_file(config_.rdzv_token_file);
    if (!token) return usage_error("--rdzv-token-file " + config_.rdzv_token_file + ": cannot read a token");
    join_["token"] = *token;
  }
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
  if (auto it = inherited_.find(std::string(torch_keys::kInitBarrierSwitch));
      it != inherited_.end() && it->second == "0" && stall.init_timeout > 0) {
    stall.torch_init_barrier = false;
    spdlog::info("{}=0: torch 2.x runs no init barrier, so --init-timeout waits for every rank to "
                 "publish its process-group address instead", torch_keys::kInitBarrierSwitch);
  }
  watch_ = std::make_unique<StallWatch>(io_, stall, host_, run_dir_->runtime_dir(), config_.node_name);
  add_supervision_env(*plan_, run_dir_->runtime_dir(), config_, inherited_);
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
  if (config_.uses_rendezvous()) {
    group_->on_first_failure([this](const WorkerOutcome& worker) {
      if (in_preflight_) return;
      rendezvous_->report_failure("rank " + std::to_string(worker.rank) + " on " + host_ +
                                      " failed with " + describe_exit(worker.exit_code, worker.signal),
                                  exit_code_for(worker));
    });
  }
  if (auto code = serve_metrics()) return *code;
  // A stall: this node's ranks are diagnosed before their stacks are dumped, and every other
  // node hears of them at once, so each node's report covers the whole job.
  group_->on_stall([this](const StallNotice& notice, const std::vector<WorkerStatus>& workers) {
    std::vector<RankProgress> local = watch_->diagnose(notice, workers);
    std::map<int, int> pids;
    for (const WorkerStatus& worker : workers) pids[worker.rank] = worker.pid;
    const HintJob job = hint_job(pids);
    for (RankProgress& rank : local)
      rank.hint = failure_hint(rank.rank, {rank.last_line}, job, hint_probes_).value_or("");
    if (rendezvous_) {
      nlohmann::json ranks = nlohmann::json::array();
      for (const RankProgress& rank : local) ranks.push_back(to_json(rank));
      rendezvous_->send({{"type", "stall_report"}, {"ranks", ranks}});
    }
    summary_.stall_ranks.insert(summary_.stall_ranks.end(), local.begin(), local.end());
  });
  return std::nullopt;
}

std::optional<int> Launch::serve_metrics() {
  if (config_.metrics_port.empty()) return std::nullopt;
  auto listen = parse_listen_address(config_.metrics_port);
  if (!listen) return usage_error("--metrics-port " + listen.error().message);
  try {
    metrics_.emplace(io_, *listen, [this] { return render_node_metrics(node_metrics()); });
  } catch (const boost::system::system_error& error) {
    spdlog::error("--metrics-port {}: cannot listen there: {}", config_.metrics_port,
                  error.code().message());
    return kExitFailure;
  }
  const auto bound = metrics_->local_endpoint();  // Port 0 asked for any free one.
  spdlog::info("metrics: http://{}/metrics", Endpoint{bound.address().to_string(), bound.port(), ""}.text());
  return std::nullopt;
}

void Launch::draw_collectives(const std::string& title, const std::string& note,
                              const std::set<int>& missing) {
  const StragglerWatch* stragglers = watch_->straggler_watch();
  if (!stragglers || stragglers->recent().empty()) return;  // Not the store's node, or torch 1.x.
  PictureMarks marks{title, std::nullopt, missing, note};
  if (const StragglerEpisode* current = stragglers->current()) marks.straggler = current->rank;
  const auto path = run_dir_->path() / "collectives.html";
  std::ofstream out(path);
  out << render_collective_picture(stragglers->recent(), stragglers->arrivals(), marks);
  if (!out.flush()) {
    spdlog::warn("cannot write the picture of the last collectives to {}", path.string());
    return;
  }
  run_dir_->keep();  // The picture is what a person opens first: it outlives the run.
  spdlog::info("the last collectives, drawn: {}", path.string());
}

NodeMetrics Launch::node_metrics() const {
  NodeMetrics metrics;
  for (const WorkerStatus& worker : group_->status())
    ++(worker.running ? metrics.workers_running : metrics.workers_exited);
  metrics.restarts = attempt_;
  if (const StragglerWatch* stragglers = watch_->straggler_watch()) {
    metrics.arrivals = stragglers->arrivals();
    if (const StragglerEpisode* current = stragglers->current()) {
      metrics.straggler = current->rank;
      metrics.straggler_cost_share = current->cost_share;
    }
    metrics.stragglers_named = stragglers->episodes().size();
    metrics.bandwidth = stragglers->bandwidth().figures();
    metrics.slow_collectives_named = stragglers->bandwidth().episodes().size();
  }
  metrics.resident_bytes = resident_memory_bytes();
  return metrics;
}

std::optional<int> Launch::join_round(int restart_count) {
  rendezvous_.reset();
  auto client = std::make_unique<RendezvousClient>(io_, config_.rdzv_endpoint);
  join_["restart_count"] = restart_count;
  spdlog::info("joining job '{}' at {} ({} node(s) expected, up to {} s)", config_.rdzv_id,
               config_.rdzv_endpoint, config_.nnodes, config_.join_timeout);
  // The daemon times the round out itself; our limit only covers a daemon that went silent.
  auto joined = client->join(
      join_, std::chrono::milliseconds(static_cast<long>(config_.join_timeout * 1000)) +
                 kConnectTimeout);
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
  PeerEvents events;
  events.on_stop = [this](const PeerStop& stop) {
    membership_change_ = stop.membership_change;
    group_->request_stop(stop.reason, stop.exit_code);
  };
  events.on_stall = [this](const nlohmann::json& message) {
    try {
      group_->request_stall(stall_notice_from_json(message));
    } catch (const std::exception& bad) {
      spdlog::error("node {} sent a malformed stall notice ({}); stopping as stalled anyway",
                    message.value("node", std::string("?")), bad.what());
      StallNotice unknown;
      unknown.what = "a stall on node " + message.value("node", std::string("?"));
      group_->request_stall(unknown);
    }
  };
  // Only the store's host watches the records; every node's console names the straggler.
  events.on_straggler = [this](const std::string& line) {
    spdlog::warn("{}", printable_text(line));
    if (line.starts_with("slow collective:")) watch_->check_links();  // Is this node's link the slow one?
  };
  events.on_stall_report = [this](const nlohmann::json& message) {
    reported_nodes_.insert(message.value("node", std::string("?")));
    try {
      for (const auto& rank : message.at("ranks"))
        summary_.stall_ranks.push_back(rank_progress_from_json(rank));
    } catch (const std::exception& bad) {
      spdlog::warn("node {} sent a malformed stall report: {}", message.value("node", std::string("?")),
                   bad.what());
    }
  };
  events.on_barrier_done = [this](const std::string& name) { watch_->complete_barrier(name); };
  rendezvous_->watch(std::move(events));
  return std::nullopt;
}

namespace {

/// Where the preflight's keys live in the job store (torch's clients add the leading slash);
/// erased before the script starts.
constexpr std::string_view kPreflightKeyPrefix = "/mcprun/preflight/";

}  // namespace

std::optional<int> Launch::run_preflight() {
  if (config_.preflight == LaunchConfig::Preflight::kOff) return std::nullopt;
  const auto python = find_executable(worker_python(inherited_), search_path_of(inherited_));
  if (!python || !python_helper_dir()) {
    spdlog::error("--preflight needs python ({}) and mcprun's python folder next to mcprun "
                  "(share/mcprun/python)", python.value_or(worker_python(inherited_)));
    return kExitFailure;
  }
  const PreflightBudget budget = preflight_budget(config_.preflight_timeout, plan_->job.world_size);
  spdlog::info("preflight: checking {} rank(s) before the script, within {:g} s (step deadline "
               "{:g} s)", plan_->job.world_size, budget.bound_s, budget.step_s);
  nlohmann::json report;
  if (auto code = preflight_pass(*python, budget, 0, {}, report)) return *code;
  if (!report.value("ok", false) && report.value("backend", std::string()) == "nccl" &&
      report.value("dead", false)) {
    // Which transport fails: every node retries alike, since every node got the same report.
    size_t pass = 0;
    for (const char* variable : {"NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"}) {
      nlohmann::json retry;
      spdlog::info("preflight: again with {}=1, within {:g} s", variable, budget.bound_s);
      if (auto code = preflight_pass(*python, budget, ++pass, {{variable, "1"}}, retry)) return *code;
      report["retries"][variable] = retry.value("ok", false);
    }
    report["transport"] = nccl_transport_finding(report["retries"]);
    report["text"] = report.value("text", std::string()) + "mcprun preflight: " +
                     report["transport"].get<std::string>() + "\n";
  }
  std::fputs(report.value("text", std::string()).c_str(), stderr);
  report.erase("text");
  const bool ok = report.value("ok", false);
  // Its largest all-reduce: the floor under which the bandwidth watch calls one slow.
  if (const auto floor = preflight_floor(report)) watch_->set_bandwidth_floor(floor->first, floor->second);
  summary_.set_preflight(std::move(report));
  if (ok) return std::nullopt;
  if (config_.preflight == LaunchConfig::Preflight::kWarn) {
    spdlog::warn("--preflight=warn: starting the script anyway");
    return std::nullopt;
  }
  spdlog::error("--preflight=fail: not starting the script (exit {})",
                static_cast<int>(kExitPreflightFailed));
  if (rendezvous_) rendezvous_->report_failure("the preflight failed on " + host_, kExitPreflightFailed);
  serve_remaining_nodes(kFailurePassOnTimeout);
  return kExitPreflightFailed;
}

std::optional<int> Launch::preflight_pass(const std::string& python, const PreflightBudget& budget,
                                          size_t number, const Environment& transport,
                                          nlohmann::json& report) {
  AttemptFiles files = run_dir_->attempt(0);
  files.attempt_dir = run_dir_->path() / ("preflight_" + std::to_string(number));
  std::error_code ec;
  std::filesystem::create_directories(files.attempt_dir, ec);
  const auto bound = std::chrono::milliseconds(static_cast<long>(budget.bound_s * 1000));
  const PreflightPass pass{number, files.attempt_dir / "report.json", files.attempt_dir / "node.json",
                           std::chrono::steady_clock::now() + bound, config_.preflight_min_busbw};
  std::ofstream(pass.node_file) << preflight_node(*plan_, config_.node_name.empty() ? host_ : config_.node_name);

  // The same ranks, pinning, binding and environment as the script, running the check instead;
  // the plan is the script's again before anything else reads it.
  std::vector<std::string> argv = {python, "-u", "-m", "mcprun._preflight"};
  const Environment job_env = plan_->extra_env;
  std::swap(plan_->argv, argv);
  for (const auto& [name, value] : transport) plan_->extra_env[name] = value;
  for (const auto& [name, value] : preflight_env(budget, pass)) plan_->extra_env[name] = value;
  // The bound is kept whatever the ranks do: past it, the check is stopped and that is its finding.
  bool overran = false;
  boost::asio::steady_timer stop_at_bound(io_, bound + std::chrono::seconds(1));
  stop_at_bound.async_wait([&](boost::system::error_code error) {
    if (error) return;
    overran = true;
    group_->request_stop(fmt::format("the preflight ran past its bound of {:g} s", budget.bound_s),
                         kExitPreflightFailed);
  });
  in_preflight_ = true;
  const AttemptResult result = group_->run_attempt(0, files);
  in_preflight_ = false;
  stop_at_bound.cancel();
  std::swap(plan_->argv, argv);
  plan_->extra_env = job_env;
  // Each pass has keys of its own: a node that starts the next pass first loses none of them.
  if (store_) store_->erase_prefix(fmt::format("{}{}/", kPreflightKeyPrefix, number));
  if (overran) {
    report = overran_preflight_report(budget);
    return std::nullopt;
  }

  // Another node that judged first may stop this one as its ranks leave: their report stands.
  const bool reported = std::filesystem::exists(pass.report_file, ec);
  switch (result.end) {
    case AttemptResult::End::kInterrupted:
      return exit_code_for_signal(result.interrupt_signal);
    case AttemptResult::End::kPeerStopped:
      if (reported && !timed_out_) break;
      spdlog::error("stopped during the preflight: {}", result.peer_reason);
      return timed_out_ ? kExitJobTimeout : result.peer_exit_code;
    case AttemptResult::End::kSpawnFailed:
      spdlog::error("cannot start the preflight: {}", result.spawn_error);
      return kExitFailure;
    default:
      break;
  }
  report = read_preflight_report(pass.report_file);
  return std::nullopt;
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

StallHooks Launch::stall_hooks() {
  StallHooks hooks;
  hooks.on_stall = [this](const StallNotice& notice) {
    spdlog::error("stall: {}", notice.what);
    // Every rank's reporter, on every node, hears it through the store and dumps its recorder.
    if (notice.kind == StallNotice::Kind::kCollective && store_)
      store_->set(kFlightRecorderDumpKey, "1");
    if (notice.collective)
      draw_collectives("stall", notice.what,
                       {notice.collective->missing.begin(), notice.collective->missing.end()});
    if (rendezvous_) {
      nlohmann::json message = to_frame_json(notice, kStallNoticeBytes);
      message["type"] = "stall";
      rendezvous_->send(message);
    }
    group_->request_stall(notice);
  };
  hooks.workers = [this] { return group_->status(); };
  if (rendezvous_) {
    hooks.forward_barrier_arrival = [this](const std::string& name, int rank) {
      rendezvous_->send({{"type", "barrier"}, {"name", name}, {"rank", rank}});
    };
  }
  hooks.on_straggler_line = [this](const std::string& line) {
    if (rendezvous_) rendezvous_->send({{"type", "straggler"}, {"line", line}});
    draw_collectives("straggler", line, {});
  };
  return hooks;
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
        if (rendezvous_) rendezvous_->report_failure("the job timed out on " + host_, kExitJobTimeout);
        return kExitJobTimeout;
      }
      if (membership_change_) {  // Scaling up is not a failure and spends no restart.
        spdlog::warn("{}", result.peer_reason);
        --restart_count;
        return std::nullopt;
      }
      spdlog::error("stopped this node's workers: {}", result.peer_reason);
      code_without_restart_ = result.peer_exit_code;
      if (restart_count >= config_.max_restarts || job_closed()) return code_without_restart_;
      spdlog::warn("restarting the worker group with the other nodes ({} of {} restarts)",
                   restart_count + 1, config_.max_restarts);
      return std::nullopt;
    case AttemptResult::End::kInterrupted:
      if (config_.under_slurm && result.interrupt_signal == SIGTERM) return cancelled_by_slurm();
      return exit_code_for_signal(result.interrupt_signal);
    case AttemptResult::End::kSpawnFailed:
      spdlog::error("cannot start a worker: {}", result.spawn_error);
      return kExitFailure;
    case AttemptResult::End::kWorkerFailed:
      // Slurm signals every process of the step: a worker may die of its SIGTERM before mcprun
      // handles its own.
      if (config_.under_slurm && exit_code_for(result.workers[result.first_failure]) ==
                                     exit_code_for_signal(SIGTERM))
        return cancelled_by_slurm();
      break;
  }
  std::map<int, int> pids;
  for (const WorkerOutcome& worker : result.workers) pids[worker.rank] = worker.pid;
  const WorkerOutcome& root = result.workers[result.first_failure];
  HintJob job = hint_job(pids);
  for (const WorkerOutcome& worker : result.workers) {
    if (!worker.failed() && !worker.stopped_by_launcher) job.finished_at[worker.rank] = worker.exit_time;
    // Still in its interpreter's teardown when mcprun stopped it, its script long done.
    if (auto exiting = exiting_at_end_.find(worker.rank);
        worker.stopped_by_launcher && exiting != exiting_at_end_.end())
      job.exiting_at[worker.rank] = exiting->second;
  }
  job.failed_at = root.exit_time;
  const std::string hint = failure_hint(root.rank, failure_text(root), job, hint_probes_).value_or("");
  summary_.set_hint(hint);
  summary_.set_early_finisher(early_finisher(root.rank, failure_text(root), job));
  std::fputs(format_failure_report(result.workers, result.first_failure, host_, restart_count,
                                   config_.max_restarts, collectives_at_end_, hint)
                 .c_str(),
             stderr);
  say_stragglers_before_the_end();
  name_nccl_logs(config_, result, run_dir_->attempt(attempt));
  code_without_restart_ = exit_code_for(root);
  if (restart_count >= config_.max_restarts || job_closed()) {
    serve_remaining_nodes(kFailurePassOnTimeout);
    return code_without_restart_;
  }
  spdlog::warn("restarting the worker group ({} of {} restarts)", restart_count + 1,
               config_.max_restarts);
  return std::nullopt;
}

std::optional<int> Launch::conclude_stall(const AttemptResult& result, int attempt, int restart_count) {
  // The other nodes sent their ranks before dumping stacks; a node that died says nothing.
  const size_t other_nodes = static_cast<size_t>(plan_->job.group_world_size - 1);
  run_until(io_, [&] { return reported_nodes_.size() >= other_nodes; }, kStallReportTimeout);
  run_dir_->keep();
  const std::string report = format_stall_report(*result.stall, summary_.stall_ranks, plan_->job.world_size);
  // The summary's hint: a rank the others waited for first, else any rank whose output matched.
  const int furthest = furthest_level(summary_.stall_ranks);
  const RankProgress* hinted = nullptr;
  for (const RankProgress& rank : summary_.stall_ranks)
    if (!rank.hint.empty() && (!hinted || (rank.level < furthest && hinted->level >= furthest)))
      hinted = &rank;
  if (hinted) summary_.set_hint(hinted->hint);
  std::fputs(report.c_str(), stderr);
  say_stragglers_before_the_end();
  const auto report_file = run_dir_->attempt(attempt).attempt_dir / "stall_report.txt";
  std::ofstream(report_file) << report;
  spdlog::info("stall report saved to {}", report_file.string());
  name_nccl_logs(config_, result, run_dir_->attempt(attempt));
  code_without_restart_ = kExitStalled;
  if (restart_count >= config_.max_restarts || job_closed()) {
    serve_remaining_nodes(kFailurePassOnTimeout);
    return code_without_restart_;
  }
  spdlog::warn("restarting the worker group after the stall ({} of {} restarts)", restart_count + 1,
               config_.max_restarts);
  return std::nullopt;
}

void Launch::say_stragglers_before_the_end() const {
  // A crawl before a failure or a stall is often its first sign: the report says it was seen.
  for (const StragglerEpisode& straggler : watch_->stragglers())
    spdlog::warn("before the end, rank {} was named a straggler ({} to {}): last at {:.0f}% of "
                 "the {} on group {}, {:.0f} ms behind; {}",
                 straggler.rank, utc_timestamp(straggler.first_seen), utc_timestamp(straggler.last_seen),
                 100 * straggler.share, straggler.step_s > 0 ? "steps" : "collectives", straggler.group,
                 1000 * straggler.median_lag_s, straggler.cause);
  for (const SlowCollective& slow : watch_->slow_collectives())
    spdlog::warn("before the end, {} of {} on group {} was named slow ({} to {}): {:.3g} GB/s, "
                 "{:.3g} GB/s before",
                 slow.op, slow.size, slow.group, utc_timestamp(slow.first_seen),
                 utc_timestamp(slow.last_seen), slow.busbw_now / 1e9, slow.busbw_before / 1e9);
}

HintJob Launch::hint_job(const std::map<int, int>& pids) const {
  HintJob job;
  job.node_gpus = node_gpus_;
  job.pinned = plan_->pinned;
  job.no_pin = config_.no_pin;
  if (auto visible = inherited_.find("CUDA_VISIBLE_DEVICES"); visible != inherited_.end())
    job.inherited_visible_devices = visible->second;
  for (const Environment* env : {&plan_->extra_env, &inherited_})  // The user's value wins.
    if (auto set = env->find("NCCL_SOCKET_IFNAME"); set != env->end()) job.socket_interface = set->second;
  job.master_port = plan_->job.master_port;
  for (const RankSlot& slot : plan_->slots) {
    HintRank& rank = job.ranks[slot.identity.rank];
    rank.local_rank = plan_->job.virtual_local_rank ? 0 : slot.identity.local_rank;
    rank.visible_gpus = slot.identity.visible_gpus;
    if (auto pid = pids.find(slot.identity.rank); pid != pids.end()) rank.pid = pid->second;
  }
  return job;
}

int Launch::cancelled_by_slurm() {
  spdlog::error("cancelled by Slurm (SIGTERM: scancel, the time limit or preemption): stopped "
                "every worker on {}; exit {}", host_, static_cast<int>(kExitSlurmCancelled));
  if (rendezvous_) rendezvous_->report_failure("Slurm cancelled the job on " + host_, kExitSlurmCancelled);
  return kExitSlurmCancelled;
}

bool Launch::job_closed() {
  if (!rendezvous_) return false;
  rendezvous_->await_failure_noted(kFailurePassOnTimeout);  // When this node's failure ended the round.
  io_.poll();  // The word on a round another node ended came with that end.
  if (!rendezvous_->job_closed()) return false;
  spdlog::error("rendezvous: {}", *rendezvous_->job_closed());
  return true;
}

void Launch::serve_remaining_nodes(std::chrono::seconds limit) {
  if (embedded_) run_until(io_, [&] { return embedded_->job_finished(config_.rdzv_id); }, limit);
}

}  // namespace mcprun
