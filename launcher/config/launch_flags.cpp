#include "launcher/config/launch_flags.hpp"

#include <cctype>

#include "common/version.hpp"

namespace mcprun {
namespace {

constexpr const char* kUsage =
    "mcprun: a native drop-in for torchrun. Spawns one fresh process per worker, pins each to\n"
    "one GPU in topology order, supervises the group and stops all of it on the first failure.\n\n"
    "usage: mcprun [flags] SCRIPT [ARGS...]    (ARGS pass through untouched)\n"
    "       mcprun topo                         (GPUs found and the rank mapping a launch uses)\n"
    "       mcprun store [--port N]             (a standalone c10d TCPStore server)";

constexpr const char* kExitCodesAndExamples =
    "\nExit codes: 0 every worker exited 0; 1-125 the first failing worker's own code; 1 mcprun\n"
    "could not proceed; 2 usage error; 3 the job stalled; 75 rendezvous failed or a node was "
    "lost;\n"
    "77 --preflight=fail found a fault; 124 --timeout passed; 128+N a worker died of, or mcprun\n"
    "was interrupted by, signal N.\n"
    "--summary-json's \"result\" (success|failed|stalled|timeout|interrupted) tells them apart.\n\n"
    "CI examples:\n"
    "  mcprun --config configs/ci-smoke.yaml          # a job file; flags given here override it\n"
    "  mcprun --config job.yaml -n 1 --timeout 120    # the same job, smaller and shorter\n"
    "  mcprun -n 2 --timeout 600 --init-timeout 60 --summary-json summary.json \\\n"
    "         --junit junit.xml train.py --epochs 1";

/// "--nproc-per-node" also answers to "--nproc_per_node" and reads PET_NPROC_PER_NODE, as in
/// torchrun.
std::string names_for(const std::string& dashed, const std::string& short_name = "") {
  std::string underscored = dashed;
  for (char& c : underscored) c = c == '-' ? '_' : c;
  std::string names = "--" + dashed;
  if (underscored != dashed) names += ",--" + underscored;
  if (!short_name.empty()) names += "," + short_name;
  return names;
}

/// Adds a torchrun option by its dashed name: its underscore spelling and its PET_ variable too.
class TorchrunOption {
 public:
  explicit TorchrunOption(CLI::App& app) : app_(app) {}
  template <class Target>
  CLI::Option* operator()(const std::string& dashed, Target& target, const std::string& help,
                          const std::string& short_name = "") const {
    return app_.add_option(names_for(dashed, short_name), target, help)
        ->envname(env_name_for(dashed));
  }

 private:
  CLI::App& app_;
};

/// Adds a torchrun switch the same way.
class TorchrunFlag {
 public:
  explicit TorchrunFlag(CLI::App& app) : app_(app) {}
  CLI::Option* operator()(const std::string& dashed, bool& target, const std::string& help,
                          const std::string& short_name = "") const {
    return app_.add_flag(names_for(dashed, short_name), target, help)
        ->envname(env_name_for(dashed));
  }

 private:
  CLI::App& app_;
};

// The flags, in the order --help lists them.

/// How many workers on how many nodes, and how the nodes find each other.
void add_job_shape_flags(CLI::App& app, LaunchConfig& config, FlagTexts& texts) {
  const TorchrunOption add(app);
  const TorchrunFlag flag(app);
  add("nproc-per-node", texts.nproc,
      "Workers per node: N, cpu, gpu (GPU count; error if none) or "
      "auto (GPU count, else CPU count)",
      "-n");
  add("nnodes", config.nnodes, "Number of nodes: N, or MIN:MAX for an elastic job");
  add("node-rank", config.node_rank,
      "Rank of this node (static backend: default 0; rendezvous: assigned unless given)");
  add("master-addr", config.master_addr, "Address of the store that rank 0 hosts");
  add("master-port", config.master_port,
      "Port of that store (default: a free port, reserved so nothing else takes it)");
  flag("standalone", config.standalone, "Single-node job with a private store on a free port");
  add("rdzv-backend", config.rdzv_backend,
      "Rendezvous backend: static, c10d, or etcd (etcd-v2: the same; both on etcd's v3 API)");
  add("rdzv-endpoint", config.rdzv_endpoint,
      "Rendezvous endpoint HOST:PORT ([IPV6]:PORT; c10d: a bare HOST is HOST:29400, as in "
      "torchrun); etcd: the members, HOST:PORT,... (a bare HOST is HOST:2379); with the static "
      "backend it is the master's address and port, and beats --master-addr/--master-port");
  add("rdzv-id", config.rdzv_id, "Job id, exported as TORCHELASTIC_RUN_ID");
  add("rdzv-conf", config.rdzv_conf,
      "Rendezvous options key=value,... (outer quotes are stripped): join_timeout (default 120 s), "
      "last_call_timeout (default 5 s), is_host; etcd: timeout (the join timeout), "
      "protocol=https, cacert, cert, key; torchrun's other keys are accepted and unused");
  app.add_option("--topology-labels", texts.labels,
                 "This node's place, e.g. rack=r1,switch=s3: nodes sharing labels get "
                 "neighbouring ranks")
      ->envname("MCPRUN_TOPOLOGY_LABELS");
  app.add_option("--node-name", config.node_name,
                 "This node's name in the rendezvous (default <hostname>:<pid>)")
      ->envname("MCPRUN_NODE_NAME");
  app.add_option("--rdzv-token-file", config.rdzv_token_file,
                 "File holding the token rendezvousd was started with (--token-file)")
      ->envname("MCPRUN_RDZV_TOKEN_FILE");
}

/// What each worker runs, and how often the group restarts.
void add_worker_flags(CLI::App& app, LaunchConfig& config) {
  const TorchrunOption add(app);
  const TorchrunFlag flag(app);
  add("max-restarts", config.max_restarts, "Restart the whole group up to N times on failure")
      ->check(CLI::NonNegativeNumber);
  add("monitor-interval", config.monitor_interval,
      "Accepted for compatibility and unnecessary: worker exits are events, never polled");
  add("start-method", config.start_method,
      "Accepted for compatibility: every worker is a fresh exec'ed process (spawn)")
      ->check(CLI::IsMember({"spawn", "fork", "forkserver"}));
  add("role", config.role, "Worker role name (ROLE_NAME)");
  flag("module", config.module, "Run SCRIPT as a Python module (python -m)", "-m");
  flag("no-python", config.no_python, "Exec SCRIPT directly instead of through Python");
  flag("run-path", config.run_path, "Run SCRIPT by path (what mcprun always does for a .py)");
}

/// Where the workers' output goes; --local-addr follows, where torchrun's --help has it.
void add_output_flags(CLI::App& app, LaunchConfig& config, FlagTexts& texts) {
  const TorchrunOption add(app);
  add("log-dir", config.log_dir, "Keep per-rank stdout/stderr logs and error files here");
  add("redirects", texts.redirects,
      "Send streams to log files only: 0 none, 1 stdout, 2 stderr, 3 both, or rank:bits,...", "-r");
  add("tee", texts.tee, "Send streams to log files and the console (same syntax as --redirects)",
      "-t");
  add("local-ranks-filter", texts.ranks_filter,
      "Show only these local ranks on the console, e.g. 0,3 (all are still logged)");
  add("local-addr", config.local_addr, "Address of this node; used as MASTER_ADDR when given");
}

/// How the group is stopped, and which signals stop it.
void add_shutdown_flags(CLI::App& app, LaunchConfig& config, FlagTexts& texts) {
  const TorchrunOption add(app);
  add("term-timeout", config.term_timeout, "Seconds between SIGTERM and SIGKILL when stopping")
      ->check(CLI::NonNegativeNumber);
  add("shutdown-timeout", texts.shutdown_timeout,
      "torchrun 2.x's name for --term-timeout (which wins when both are given); without either, "
      "TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 10 s")
      ->check(CLI::NonNegativeNumber);
  add("signals-to-handle", texts.signals,
      "Signals mcprun handles, comma-separated: SIGTERM, SIGINT, SIGHUP, SIGQUIT (and SIGALRM, "
      "SIGXCPU, SIGXFSZ, SIGPWR, SIGVTALRM, SIGPROF) are forwarded to every worker and stop the "
      "group. SIGUSR1 and SIGUSR2, listed or not, are forwarded only: the workers keep running "
      "(Slurm's preemption warning). Other unlisted signals keep their default action");
}

/// torch 2.x's CPU and GPU placement modes.
void add_binding_flags(CLI::App& app, LaunchConfig& config, FlagTexts& texts) {
  const TorchrunOption add(app);
  const TorchrunFlag flag(app);
  add("numa-binding", texts.numa,
      "Bind each worker to CPUs near its GPU: node, socket, exclusive or core-complex (torch 2.x's "
      "modes)");
  flag("virtual-local-rank", config.virtual_local_rank,
       "Every worker sees LOCAL_RANK=0 and its one GPU as device 0, so all ranks compile the same "
       "code");
}

/// torchrun's flags that mcprun accepts with their default value only.
void add_accepted_torchrun_flags(CLI::App& app, FlagTexts& texts) {
  const TorchrunOption add(app);
  add("event-log-handler", texts.event_log_handler,
      "Accepted for torchrun: mcprun has no event log handlers (anything but null is ignored "
      "with a warning)");
  app.add_option(names_for("logs-specs"), texts.logs_specs,
                 "Accepted for torchrun: only its default LogsSpecs (default); mcprun's logs are "
                 "laid out by --log-dir");
  add("duplicate-stdout-filters", texts.stdout_filters,
      "Accepted for torchrun when empty: mcprun does not copy matching lines to a second file "
      "(grep --log-dir's stdout.log)");
  add("duplicate-stderr-filters", texts.stderr_filters,
      "Accepted for torchrun when empty: mcprun does not copy matching lines to a second file "
      "(grep --log-dir's stderr.log)");
}

/// What CI asks of a run: a time limit, a job file, reports, a GPU lease's patience.
void add_ci_flags(CLI::App& app, LaunchConfig& config, FlagTexts& texts) {
  const TorchrunOption add(app);
  app.add_option("--timeout", config.job_timeout,
                 "Wall-clock limit in seconds for the whole job, restarts included (0: none); "
                 "on expiry the group is stopped and mcprun exits 124")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--config", texts.job_file_path,
                 "YAML job file: any of these flags by its long name (nproc-per-node: 2), env: "
                 "(added to every worker's environment), script: and args:. Flags given here "
                 "override it (see configs/ci-smoke.yaml)")
      ->type_name("FILE");
  app.add_option("--summary-json", config.summary_json,
                 "When mcprun ends, however it ends, write the result, exit code, root cause and "
                 "each local rank's exit, duration and logs to this file as JSON")
      ->type_name("FILE");
  app.add_option("--junit", config.junit,
                 "When mcprun ends, write a JUnit XML report to this file: one test case per local "
                 "rank; a failed or stalled rank carries the root cause and its last output lines")
      ->type_name("FILE");
  add("gpu-wait", config.gpu_wait,
      "On a box whose rendezvousd leases GPUs (MCPRUN_DAEMON, default its unix socket under "
      "/run/mcprun): seconds to wait for enough free GPUs; 0 fails at once naming who holds them")
      ->check(CLI::NonNegativeNumber);
}

/// The stall watchdogs, and what a stall leaves behind to diagnose it.
void add_diagnosis_flags(CLI::App& app, LaunchConfig& config, FlagTexts& texts) {
  const TorchrunOption add(app);
  const TorchrunFlag flag(app);
  add("init-timeout", config.stall.init_timeout,
      "Seconds for every rank to pass init_process_group's barrier, from the first "
      "rank's arrival at the job store in each attempt; a rank missing then is a stall "
      "(exit 3). 0: off")
      ->check(CLI::NonNegativeNumber);
  const auto seconds_or_off = [](const std::string& text) -> std::string {
    if (text == "off") return "";
    char* end = nullptr;
    const double seconds = std::strtod(text.c_str(), &end);
    return !text.empty() && *end == '\0' && seconds > 0 ? "" : "expected seconds > 0 or off";
  };
  add("collective-timeout", texts.collective_timeout,
      "Seconds with a collective or barrier pending and no progress anywhere in the job: no "
      "collective completes on any rank and no rank outside one is busy. Then it is a stall "
      "(exit 3), reported with the collective and the ranks missing from it. off: no watchdog")
      ->check(seconds_or_off)
      ->type_name("S|off");
  add("straggler-window", texts.straggler_window,
      "Seconds of collectives over which the rank that holds the others back is named, while "
      "the job runs (torch 2.x; needs the collective watchdog). off: no straggler watch")
      ->check(seconds_or_off)
      ->type_name("S|off");
  add("metrics-port", config.metrics_port,
      "Serve this node's metrics in Prometheus' text format at http://[ADDR:]PORT/metrics: its "
      "workers and, on the node that serves the job store, every rank's collectives, wait time, "
      "arrival lag and the straggler (docs/stalls.md). A bare PORT listens on 127.0.0.1")
      ->type_name("[ADDR:]PORT");
  add("straggler-min-cost", config.stall.stragglers.min_cost_share,
      "A straggler costs the others at least this share of the window in waiting for it, and "
      "caused two thirds of their waits")
      ->check(CLI::Range(0.01, 1.0));
  add("straggler-share", config.stall.stragglers.min_share,
      "...and held them back at least at this share of the window's steps, so that a rare "
      "event (an evaluation every 50 steps) names nobody")
      ->check(CLI::Range(0.01, 1.0));
  add("straggler-min-lag", config.stall.stragglers.min_lag_s,
      "Seconds behind the others' median arrival that count as holding them back at a step")
      ->check(CLI::NonNegativeNumber);
  add("straggler-min-step-share", config.stall.stragglers.min_step_share,
      "...and at least this share of a step, so that jitter on a short step names nobody")
      ->check(CLI::Range(0.0, 1.0));
  add("slow-collective-share", config.stall.stragglers.slow_collective_share,
      "A kind of collective (group, op, size) is slow under this share of the bus "
      "bandwidth the job measured earlier (the median), or of --preflight's floor")
      ->check(CLI::Range(0.01, 1.0));
  add("slow-collective-min-time", config.stall.stragglers.slow_collective_min_s,
      "...where one takes this many seconds at least (the window's mean), so that a fast "
      "collective's jitter names nothing")
      ->check(CLI::NonNegativeNumber);
  add("heartbeat-timeout", config.stall.heartbeat_timeout,
      "Seconds without mcprun.heartbeat() from a rank that has called it before; "
      "longer is a stall. Ranks that never call it are not watched. 0: off")
      ->check(CLI::NonNegativeNumber);
  add("silence-timeout", config.stall.silence_timeout,
      "Seconds without a line of output from a rank that count as a stall, for "
      "scripts with no hooks. 0: off")
      ->check(CLI::NonNegativeNumber);
  flag("no-stack-dumps", texts.no_stack_dumps,
       "On a stall, stop at once: no native stack dumps (py-spy, else gdb) and no Python "
       "tracebacks (SIGABRT to faulthandler) first");
  app.add_flag("--preflight{warn}", texts.preflight,
               "Before the script, check the job's own ranks: process-group init, all-reduce bus "
               "bandwidth, every pair of ranks; name a slow or dead rank, GPU, node or link "
               "(docs/preflight.md). warn (the bare flag): report and run; fail: a fault stops "
               "the launch (exit 77); off (default)")
      ->check(CLI::IsMember({"off", "warn", "fail", "true", "false"}))  // true, false: a job file's
      ->type_name("warn|fail");
  app.add_option("--preflight-timeout", config.preflight_timeout,
                 "Seconds each preflight step may take; the whole check's bound, printed first, "
                 "follows from it and the rank count")
      ->check(CLI::PositiveNumber);
  app.add_option("--preflight-min-busbw", config.preflight_min_busbw,
                 "GB/s: the preflight fails a job whose all-reduce bus bandwidth is under it, "
                 "whatever the ranks say of each other (0, the default: no floor)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--nccl-debug", config.nccl_debug,
               "Set NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET and TORCH_DISTRIBUTED_DEBUG=DETAIL "
               "for every worker");
}

/// Which GPUs and CPUs, and mcprun's own switches.
void add_launcher_flags(CLI::App& app, LaunchConfig& config, FlagTexts& texts) {
  const TorchrunOption add(app);
  const TorchrunFlag flag(app);
  flag("dry-run", config.dry_run,
       "Print each rank's GPU, CPUs, environment and argv; start nothing");
  flag("no-pin", config.no_pin, "Leave CUDA_VISIBLE_DEVICES alone (allows more ranks than GPUs)");
  add("gpus", texts.gpus, "Use only these GPUs (CUDA_VISIBLE_DEVICES syntax: indices or UUIDs)");
  add("bind", texts.bind,
      "CPU affinity per worker: none (default: the OS and torch's own thread pools place "
      "threads) or numa (the CPUs local to the worker's GPU)")
      ->check(CLI::IsMember({"none", "numa"}));
  flag("verbose", config.verbose, "Log each step of the launch", "-v");
  app.add_flag("--no-slurm", config.no_slurm,
               "Ignore SLURM_* variables (also MCPRUN_SLURM=0). Under srun, mcprun otherwise takes "
               "nnodes, node rank, master (first node of the step), port 20000 + job id % 10000, "
               "run id and GPUs from Slurm wherever no flag or PET_* variable sets them");
}

}  // namespace

std::string env_name_for(const std::string& dashed) {
  std::string name = "PET_";
  for (char c : dashed) name += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return name;
}

void define_launch_flags(CLI::App& app, LaunchConfig& config, FlagTexts& texts) {
  app.name("mcprun");
  app.description(kUsage);
  app.prefix_command();  // Everything from the script on belongs to the script.
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", "mcprun " + mcprun_version());
  app.footer(kExitCodesAndExamples);
  add_job_shape_flags(app, config, texts);
  add_worker_flags(app, config);
  add_output_flags(app, config, texts);
  add_shutdown_flags(app, config, texts);
  add_binding_flags(app, config, texts);
  add_accepted_torchrun_flags(app, texts);
  add_ci_flags(app, config, texts);
  add_diagnosis_flags(app, config, texts);
  add_launcher_flags(app, config, texts);
}

}  // namespace mcprun
