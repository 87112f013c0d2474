// mcprun: parse torchrun's flags, plan the ranks, then supervise the worker group to the end.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "common/descriptor_limit.hpp"
#include "common/event_loop.hpp"
#include "common/exit_status.hpp"
#include "common/logging.hpp"
#include "common/protocol.hpp"
#include "common/topology.hpp"
#include "launcher/doctor.hpp"
#include "launcher/failure_report.hpp"
#include "launcher/operator_command.hpp"
#include "launcher/port_reservation.hpp"
#include "launcher/rank_plan.hpp"
#include "launcher/rendezvous_client.hpp"
#include "launcher/run_summary.hpp"
#include "launcher/stall_report.hpp"
#include "launcher/stall_watch.hpp"
#include "launcher/store_command.hpp"
#include "launcher/worker_group.hpp"
#include "rendezvousd/rendezvous_server.hpp"

namespace mcprun {
namespace {

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "localhost";
}

/// The run's folder: attempt_<n>/<local rank>/{stdout.log,stderr.log,error.json}. Under
/// --log-dir it is kept; otherwise it is a temp folder removed at exit unless logs were asked for.
class RunDirectory {
 public:
  RunDirectory(const LaunchConfig& config, std::string* error) {
    const bool streams_to_files = config.redirects.all || config.tee.all ||
                                  !config.redirects.per_rank.empty() || !config.tee.per_rank.empty();
    keep_ = !config.log_dir.empty() || streams_to_files || config.nccl_debug;
    std::filesystem::path parent = config.log_dir;
    if (parent.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      parent = tmp && *tmp ? tmp : "/tmp";
    }
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    std::string pattern = (parent / ("mcprun_" + config.rdzv_id + "_XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      *error = "cannot create a run folder under " + parent.string() + ": " + std::strerror(errno);
      return;
    }
    path_ = pattern;
    if (keep_) spdlog::info("logs of this run: {}", path_.string());
  }
  ~RunDirectory() {
    std::error_code ec;
    if (!runtime_.empty()) std::filesystem::remove_all(runtime_, ec);
    if (!keep_ && !path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  AttemptFiles attempt(int restart_count) const {
    return {path_ / ("attempt_" + std::to_string(restart_count)), keep_};
  }
  bool ok() const { return !path_.empty(); }
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
  static constexpr size_t kUnixPathLimit = 100;  ///< sun_path holds 108 bytes.
  std::filesystem::path path_;
  std::filesystem::path runtime_;
  bool keep_ = false;
};

/// How long the node hosting the embedded rendezvous keeps serving after its own workers are
/// done, so the other nodes can report theirs (torchrun's exit barrier).
constexpr std::chrono::seconds kHostExitBarrierTimeout{60};

/// torchrun's is_host guess: the endpoint names this machine.
bool endpoint_is_local(const std::string& endpoint) {
  const std::string host = endpoint.substr(0, endpoint.rfind(':'));
  if (host == "localhost" || host == host_name()) return true;
  boost::system::error_code ec;
  auto address = boost::asio::ip::make_address(host, ec);
  if (ec) return false;
  return address.is_loopback() || interface_for_address(address.to_string()).has_value();
}

/// Hosts the rendezvous in-process when this node is the endpoint and nothing listens there yet.
std::unique_ptr<RendezvousServer> host_embedded_rendezvous(boost::asio::io_context& io,
                                                           const LaunchConfig& config) {
  if (!config.is_host.value_or(endpoint_is_local(config.rdzv_endpoint))) return nullptr;
  const std::string& endpoint = config.rdzv_endpoint;
  int port = -1;
  try {
    port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  } catch (const std::exception&) {
  }
  if (port < 1 || port > 65535) return nullptr;
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

/// The python helper (import mcprun) next to the binary: <prefix>/share/mcprun/python, which
/// the build tree mirrors.
std::optional<std::filesystem::path> python_helper_dir() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return std::nullopt;
  auto dir = exe.parent_path().parent_path() / "share" / "mcprun" / "python";
  if (!std::filesystem::exists(dir / "mcprun" / "__init__.py", ec)) return std::nullopt;
  return dir;
}

/// The job store's listening socket on MASTER_PORT: the socket mcprun reserved when it holds
/// that port, else a fresh bind (a --master-port the user chose).
std::optional<boost::asio::ip::tcp::acceptor> store_acceptor(
    boost::asio::io_context& io, int port, std::optional<PortReservation>& reservation,
    std::string* error) {
  namespace ip = boost::asio::ip;
  ip::tcp::acceptor acceptor(io);
  boost::system::error_code ec;
  if (reservation && reservation->port() == port) {
    acceptor.assign(ip::tcp::v4(), reservation->take_socket().release(), ec);
    reservation.reset();
  } else {
    acceptor.open(ip::tcp::v4(), ec);
    if (!ec) acceptor.set_option(ip::tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind({ip::tcp::v4(), static_cast<unsigned short>(port)}, ec);
  }
  if (!ec) acceptor.listen(ip::tcp::socket::max_listen_connections, ec);
  if (ec) {
    *error = fmt::format("cannot serve the job store on MASTER_PORT {}: {}", port, ec.message());
    return std::nullopt;
  }
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
  if (endpoint.rfind("unix:", 0) != 0) {
    if (!endpoint.empty()) spdlog::warn("MCPRUN_DAEMON={}: GPU leases need unix:PATH; not leasing", endpoint);
    return std::nullopt;
  }
  std::error_code ec;
  if (!std::filesystem::exists(endpoint.substr(5), ec)) return std::nullopt;
  return endpoint;
}

/// How many GPUs to lease: one per rank when ranks are pinned, all of them for -n gpu|auto.
int gpus_wanted(const LaunchConfig& config, const std::vector<GpuDevice>& gpus) {
  if (config.no_pin || gpus.empty()) return 0;
  if (config.nproc.kind == NprocSpec::Kind::kCount) return config.nproc.count;
  return config.nproc.kind == NprocSpec::Kind::kCpu ? 0 : static_cast<int>(gpus.size());
}

int show_topology() {
  std::vector<GpuDevice> gpus = discover_gpus();
  annotate_with_nvml(gpus);
  std::optional<std::string> allowed;
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) allowed = visible;
  std::cout << format_topology(gpus, topology_order(gpus, allowed));
  return kExitSuccess;
}

int launch(const LaunchConfig& config, RunSummary& summary) {
  // A job file's env: acts as if exported before mcprun: OMP_NUM_THREADS is honoured, RANK warned.
  Environment inherited = current_environment();
  for (const auto& [name, value] : config.env) inherited[name] = value;
  boost::asio::io_context io;
  std::vector<GpuDevice> gpus = discover_gpus();
  annotate_with_nvml(gpus);

  // On a shared box the local rendezvousd leases this job its GPUs and master port, for as long
  // as this connection lasts: two users' jobs never share either.
  std::unique_ptr<RendezvousClient> lease_holder;
  std::optional<GrantedLease> lease;
  if (auto endpoint = lease_endpoint(inherited); endpoint && !config.dry_run) {
    lease_holder = std::make_unique<RendezvousClient>(io, *endpoint);
    auto granted = lease_holder->lease(
        {{"gpus", gpus_wanted(config, gpus)}, {"wait_s", config.gpu_wait}, {"job", config.rdzv_id}},
        std::chrono::milliseconds(static_cast<long>(config.gpu_wait * 1000)) + kRendezvousConnectTimeout);
    if (auto* refused = std::get_if<std::string>(&granted)) {
      spdlog::error("no GPU lease from rendezvousd at {}: {}", *endpoint, *refused);
      return kExitRendezvous;
    }
    lease = std::get<GrantedLease>(granted);
    std::erase_if(gpus, [&](const GpuDevice& gpu) {
      return std::find(lease->gpus.begin(), lease->gpus.end(), gpu.bus_id) == lease->gpus.end();
    });
    spdlog::info("leased from rendezvousd: {} GPU(s), master port {}", lease->gpus.size(), lease->port);
  }

  std::optional<PortReservation> reservation;
  int master_port = config.master_port.value_or(0);
  if (!config.master_port) {
    std::string error;
    reservation = PortReservation::reserve(&error, lease ? lease->port : 0);
    if (!reservation) {
      spdlog::error("cannot reserve a free MASTER_PORT: {}", error);
      return kExitFailure;
    }
    master_port = reservation->port();
  }

  auto planned = build_rank_plan(config, std::move(gpus), inherited, master_port);
  if (auto* error = std::get_if<UsageError>(&planned)) return usage_error(error->message);
  RankPlan& plan = std::get<RankPlan>(planned);
  for (const auto& warning : plan.warnings) spdlog::warn("{}", warning);
  if (config.dry_run) {
    std::cout << format_rank_plan(plan, inherited);
    return kExitSuccess;
  }

  const std::string host = host_name();
  std::unique_ptr<RendezvousServer> embedded;
  nlohmann::json join;
  if (config.uses_rendezvous()) {
    if (config.rdzv_backend == "c10d") embedded = host_embedded_rendezvous(io, config);
    join = {{"job", config.rdzv_id},
            {"node", config.node_name.empty() ? host + ":" + std::to_string(::getpid())
                                              : config.node_name},
            {"nproc", plan.slots.size()},
            {"master_port", master_port},
            {"node_rank", config.node_rank.value_or(-1)},
            {"labels", config.topology_labels},
            {"gpus", gpu_topology(plan)},
            {"min_nodes", config.min_nodes},
            {"max_nodes", config.max_nodes},
            {"join_timeout_s", config.join_timeout},
            {"last_call_timeout_s", config.last_call_timeout}};
    if (!config.rdzv_token_file.empty()) {
      auto token = read_token_file(config.rdzv_token_file);
      if (!token) return usage_error("--rdzv-token-file " + config.rdzv_token_file + ": cannot read a token");
      join["token"] = *token;
    }
  }
  /// One rendezvous round: join, then move the plan to its place in the job.
  auto join_round = [&]() -> std::unique_ptr<RendezvousClient> {
    auto client = std::make_unique<RendezvousClient>(io, config.rdzv_endpoint);
    spdlog::info("joining job '{}' at {} ({} node(s) expected, up to {} s)", config.rdzv_id,
                 config.rdzv_endpoint, config.nnodes, config.join_timeout);
    // The daemon times the round out itself; our limit only covers a daemon that went silent.
    auto joined = client->join(
        join, std::chrono::milliseconds(static_cast<long>(config.join_timeout * 1000)) +
                  kRendezvousConnectTimeout);
    if (auto* failure = std::get_if<std::string>(&joined)) {
      spdlog::error("{}", *failure);
      return nullptr;
    }
    const Assignment& assignment = std::get<Assignment>(joined);
    place_in_job(plan, assignment);
    if (auto interface = interface_for_address(client->local_address()))
      set_socket_interface(plan, *interface, inherited);
    spdlog::info("node rank {} of {}: ranks {}-{} of {}, MASTER_ADDR={} MASTER_PORT={}",
                 assignment.group_rank, assignment.group_world_size, assignment.rank_offset,
                 assignment.rank_offset + static_cast<int>(plan.slots.size()) - 1,
                 assignment.world_size, assignment.master_addr, assignment.master_port);
    return client;
  };

  std::string error;
  RunDirectory run_dir(config, &error);
  if (!run_dir.ok()) {
    spdlog::error("{}", error);
    return kExitFailure;
  }
  StallWatch watch(io, config.stall, host, run_dir.runtime_dir());
  for (auto& [name, value] : watch.worker_env()) plan.extra_env[name] = value;
  if (auto helper = python_helper_dir()) {
    auto inherited_path = inherited.find("PYTHONPATH");
    plan.extra_env["PYTHONPATH"] = helper->string() + (inherited_path == inherited.end()
                                                           ? ""
                                                           : ":" + inherited_path->second);
  }
  // The master node serves the job store; every rank's env:// init is its client.
  auto serve_store_if_master = [&]() -> bool {
    if (plan.job.group_rank != 0) {
      watch.stop_hosting_store();
      return true;
    }
    if (watch.hosts_store()) return true;
    auto acceptor = store_acceptor(io, plan.job.master_port, reservation, &error);
    if (!acceptor) {
      spdlog::error("{}", error);
      return false;
    }
    raise_descriptor_limit();  // A connection or two per rank of the job.
    watch.host_store(std::move(*acceptor));
    return true;
  };

  PosixProcessControl control;
  WorkerGroup group(io, control, plan, config, inherited);
  // --timeout: one deadline for the whole job, across rounds and restarts.
  bool timed_out = false;
  boost::asio::steady_timer job_deadline(io);
  if (config.job_timeout > 0) {
    job_deadline.expires_after(std::chrono::milliseconds(static_cast<long>(config.job_timeout * 1000)));
    job_deadline.async_wait([&](boost::system::error_code ec) {
      if (ec) return;
      timed_out = true;
      group.request_stop(fmt::format("the job ran past --timeout {} s", config.job_timeout),
                         kExitJobTimeout);
    });
  }
  std::unique_ptr<RendezvousClient> rendezvous;
  if (config.uses_rendezvous()) {
    group.on_first_failure([&](const WorkerOutcome& worker) {
      rendezvous->report_failure("rank " + std::to_string(worker.rank) + " on " + host + " failed with " +
                                     describe_exit(worker.exit_code, worker.signal),
                                 exit_code_for(worker));
    });
  }
  // A stall: this node's ranks are diagnosed before their stacks are dumped, and every other
  // node hears of them at once, so each node's report covers the whole job.
  std::vector<RankProgress>& stall_ranks = summary.stall_ranks;
  std::set<std::string> reported_nodes;
  group.on_stall([&](const StallNotice& notice, const std::vector<WorkerStatus>& workers) {
    std::vector<RankProgress> local = watch.diagnose(notice, workers);
    if (rendezvous) {
      nlohmann::json ranks = nlohmann::json::array();
      for (const RankProgress& rank : local) ranks.push_back(to_json(rank));
      rendezvous->send({{"type", "stall_report"}, {"ranks", ranks}});
    }
    stall_ranks.insert(stall_ranks.end(), local.begin(), local.end());
  });
  // The host of an embedded rendezvous serves the others until their jobs are over too.
  auto serve_remaining_nodes = [&](std::chrono::seconds limit) {
    if (embedded) run_until(io, [&] { return embedded->job_finished(config.rdzv_id); }, limit);
  };
  bool membership_change = false;
  for (int attempt = 0, restart_count = 0;; ++attempt, ++restart_count) {
    // Every attempt of a multi-node job is a fresh round: all nodes restart together.
    if (config.uses_rendezvous()) {
      rendezvous.reset();
      rendezvous = join_round();
      if (!rendezvous) return kExitRendezvous;
      membership_change = false;
      PeerEvents events;
      events.on_stop = [&](const PeerStop& stop) {
        membership_change = stop.membership_change;
        group.request_stop(stop.reason, stop.exit_code);
      };
      events.on_stall = [&](const nlohmann::json& message) {
        try {
          group.request_stall(stall_notice_from_json(message));
        } catch (const std::exception& bad) {
          spdlog::error("node {} sent a malformed stall notice ({}); stopping as stalled anyway",
                        message.value("node", std::string("?")), bad.what());
          StallNotice unknown;
          unknown.what = "a stall on node " + message.value("node", std::string("?"));
          group.request_stall(unknown);
        }
      };
      events.on_stall_report = [&](const nlohmann::json& message) {
        reported_nodes.insert(message.value("node", std::string("?")));
        try {
          for (const auto& rank : message.at("ranks")) stall_ranks.push_back(rank_progress_from_json(rank));
        } catch (const std::exception& bad) {
          spdlog::warn("node {} sent a malformed stall report: {}", message.value("node", std::string("?")),
                       bad.what());
        }
      };
      events.on_barrier_done = [&](const std::string& name) { watch.complete_barrier(name); };
      rendezvous->watch(std::move(events));
    }
    if (!serve_store_if_master()) return kExitFailure;
    stall_ranks.clear();
    reported_nodes.clear();
    StallHooks hooks;
    hooks.on_stall = [&](const StallNotice& notice) {
      spdlog::error("stall: {}", notice.what);
      if (rendezvous) {
        nlohmann::json message = to_json(notice);
        message["type"] = "stall";
        rendezvous->send(message);
      }
      group.request_stall(notice);
    };
    hooks.workers = [&] { return group.status(); };
    if (rendezvous)
      hooks.forward_barrier_arrival = [&](const std::string& name, int rank) {
        rendezvous->send({{"type", "barrier"}, {"name", name}, {"rank", rank}});
      };
    watch.begin_attempt(restart_count, plan.job.world_size, plan.job.master_port, std::move(hooks));
    summary.begin_attempt();
    AttemptResult result = group.run_attempt(restart_count, run_dir.attempt(attempt));
    summary.end_attempt(result, run_dir.attempt(attempt), plan.job.world_size);
    watch.end_attempt();
    switch (result.end) {
      case AttemptResult::End::kSucceeded:
        if (rendezvous) rendezvous->report_done();
        serve_remaining_nodes(kHostExitBarrierTimeout);
        return kExitSuccess;
      case AttemptResult::End::kStalled: {
        // The other nodes sent their ranks before dumping stacks; a node that died says nothing.
        const size_t other_nodes = static_cast<size_t>(plan.job.group_world_size - 1);
        run_until(io, [&] { return reported_nodes.size() >= other_nodes; }, kStallReportTimeout);
        run_dir.keep();
        const std::string report = format_stall_report(*result.stall, stall_ranks, plan.job.world_size);
        std::fputs(report.c_str(), stderr);
        const auto report_file = run_dir.attempt(attempt).attempt_dir / "stall_report.txt";
        std::ofstream(report_file) << report;
        spdlog::info("stall report saved to {}", report_file.string());
        name_nccl_logs(config, result, run_dir.attempt(attempt));
        if (restart_count >= config.max_restarts) {
          serve_remaining_nodes(std::chrono::seconds(2));
          return kExitStalled;
        }
        spdlog::warn("restarting the worker group after the stall ({} of {} restarts)",
                     restart_count + 1, config.max_restarts);
        continue;
      }
      case AttemptResult::End::kPeerStopped:
        if (timed_out) {
          spdlog::error("stopped every worker: {}", result.peer_reason);
          if (rendezvous) rendezvous->report_failure("the job timed out on " + host, kExitJobTimeout);
          return kExitJobTimeout;
        }
        if (membership_change) {  // Scaling up is not a failure and spends no restart.
          spdlog::warn("{}", result.peer_reason);
          --restart_count;
          continue;
        }
        spdlog::error("stopped this node's workers: {}", result.peer_reason);
        if (restart_count >= config.max_restarts) return result.peer_exit_code;
        spdlog::warn("restarting the worker group with the other nodes ({} of {} restarts)",
                     restart_count + 1, config.max_restarts);
        continue;
      case AttemptResult::End::kInterrupted:
        return exit_code_for_signal(result.interrupt_signal);
      case AttemptResult::End::kSpawnFailed:
        spdlog::error("cannot start a worker: {}", result.spawn_error);
        return kExitFailure;
      case AttemptResult::End::kWorkerFailed:
        break;
    }
    std::fputs(format_failure_report(result.workers, result.first_failure, host, restart_count,
                                     config.max_restarts)
                   .c_str(),
               stderr);
    name_nccl_logs(config, result, run_dir.attempt(attempt));
    if (restart_count >= config.max_restarts) {
      serve_remaining_nodes(std::chrono::seconds(2));  // Long enough to pass the failure on.
      return exit_code_for(result.workers[result.first_failure]);
    }
    spdlog::warn("restarting the worker group ({} of {} restarts)", restart_count + 1,
                 config.max_restarts);
  }
}

}  // namespace
}  // namespace mcprun

int main(int argc, char** argv) {
  using namespace mcprun;
  // A console that went away must not kill the launcher mid-teardown.
  ::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (!args.empty() && (args.front() == "jobs" || args.front() == "status" || args.front() == "stop")) {
      init_logging("mcprun", false);
      return run_operator_command(args);
    }
    if (!args.empty() && args.front() == "topo") {
      init_logging("mcprun", false);
      return show_topology();
    }
    if (!args.empty() && args.front() == "store")
      return run_store_command({args.begin() + 1, args.end()});
    if (!args.empty() && args.front() == "doctor")
      return run_doctor({args.begin() + 1, args.end()});
    ParseResult parsed = parse_launch_config(args);
    if (auto* info = std::get_if<InfoRequest>(&parsed)) {
      std::cout << info->text;
      return kExitSuccess;
    }
    if (auto* error = std::get_if<UsageError>(&parsed)) return usage_error(error->message);
    const LaunchConfig& config = std::get<LaunchConfig>(parsed);
    init_logging("mcprun", config.verbose);
    RunSummary summary(config, host_name());
    const int code = launch(config, summary);
    summary.write(code);  // Every ending of launch(), for CI.
    return code;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "mcprun: fatal: %s\n", error.what());
    return kExitFailure;
  }
}
