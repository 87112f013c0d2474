#include "launcher/config/launch_config.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <sstream>

#include "common/endpoint.hpp"
#include "common/version.hpp"
#include "launcher/config/job_file.hpp"
#include "launcher/config/slurm.hpp"
#include "common/sys.hpp"

namespace mcprun {
namespace {

std::optional<int> parse_int(std::string_view text) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<NprocSpec> parse_nproc(const std::string& text) {
  if (text == "cpu") return NprocSpec{NprocSpec::Kind::kCpu, 0};
  if (text == "gpu") return NprocSpec{NprocSpec::Kind::kGpu, 0};
  if (text == "auto") return NprocSpec{NprocSpec::Kind::kAuto, 0};
  auto count = parse_int(text);
  if (!count || *count < 1) return std::nullopt;
  return NprocSpec{NprocSpec::Kind::kCount, *count};
}

std::optional<std::set<int>> parse_rank_list(const std::string& text) {
  std::set<int> ranks;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    auto rank = parse_int(item);
    if (!rank || *rank < 0) return std::nullopt;
    ranks.insert(*rank);
  }
  if (ranks.empty()) return std::nullopt;
  return ranks;
}

/// "--nproc-per-node" also answers to "--nproc_per_node" and reads PET_NPROC_PER_NODE, as in torchrun.
std::string names_for(const std::string& dashed, const std::string& short_name = "") {
  std::string underscored = dashed;
  for (char& c : underscored) c = c == '-' ? '_' : c;
  std::string names = "--" + dashed;
  if (underscored != dashed) names += ",--" + underscored;
  if (!short_name.empty()) names += "," + short_name;
  return names;
}

/// Without the blanks and quotes around it: quotes a wrapper script meant for a shell reach
/// mcprun as they reach torchrun's argparse (--rdzv-conf='join_timeout=5,last_call_timeout=1'),
/// whole-value or per item, and no key, value or signal name holds one.
std::string unquoted(std::string_view text) {
  auto strip = [](char c) { return c == ' ' || c == '\t' || c == '\'' || c == '"'; };
  while (!text.empty() && strip(text.front())) text.remove_prefix(1);
  while (!text.empty() && strip(text.back())) text.remove_suffix(1);
  return std::string(text);
}

std::string env_name_for(const std::string& dashed) {
  std::string name = "PET_";
  for (char c : dashed) name += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return name;
}

/// The signals --signals-to-handle may name: the four that stop the group by default, the two
/// that are only forwarded, and the other terminating ones a scheduler may send first.
constexpr std::pair<const char*, int> kHandledSignals[] = {
    {"SIGTERM", SIGTERM}, {"SIGINT", SIGINT},   {"SIGHUP", SIGHUP},       {"SIGQUIT", SIGQUIT},
    {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}, {"SIGALRM", SIGALRM},     {"SIGXCPU", SIGXCPU},
    {"SIGXFSZ", SIGXFSZ}, {"SIGPWR", SIGPWR},   {"SIGVTALRM", SIGVTALRM}, {"SIGPROF", SIGPROF}};

/// rdzv-conf keys torch 2.x reads (dynamic, c10d, etcd and static rendezvous) that mcprun has
/// no use for: accepted and named in one warning.
constexpr const char* kUnusedRdzvKeys[] = {
    "close_timeout", "heartbeat_timeout", "keep_alive_interval", "keep_alive_max_attempt",
    "read_timeout", "timeout", "store_type", "use_libuv", "rank", "protocol", "cert", "key",
    "cacert", "etcd_prefix", "ssl_cert", "ssl_cert_key", "ca_cert"};

/// torch's get_as_bool.
std::optional<bool> parse_bool(std::string value) {
  for (char& c : value) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* yes : {"1", "true", "t", "yes", "y"})
    if (value == yes) return true;
  for (const char* no : {"0", "false", "f", "no", "n"})
    if (value == no) return false;
  return std::nullopt;
}

/// Applies --rdzv-conf to `config`: quotes stripped, honoured keys checked, torch's other keys
/// collected in one warning.
Expected<void> apply_rdzv_conf(const std::string& text, LaunchConfig& config) {
  std::vector<std::string> unused;
  std::stringstream in(unquoted(text));
  for (std::string raw; std::getline(in, raw, ',');) {
    const std::string item = unquoted(raw);
    if (item.empty()) continue;
    const auto eq = item.find('=');
    const std::string key = unquoted(item.substr(0, eq));
    const std::string value = eq == std::string::npos ? "" : unquoted(item.substr(eq + 1));
    if (value.empty()) return Error{"--rdzv-conf " + item + ": expected key=value"};
    if (key == "join_timeout" || key == "last_call_timeout") {
      char* end = nullptr;
      const double seconds = std::strtod(value.c_str(), &end);
      if (!end || *end != '\0' || !(seconds > 0))
        return Error{"--rdzv-conf " + item + ": expected " + key + "=SECONDS (a number > 0)"};
      (key == "join_timeout" ? config.join_timeout : config.last_call_timeout) = seconds;
    } else if (key == "is_host") {
      config.is_host = parse_bool(value);
      if (!config.is_host)
        return Error{"--rdzv-conf " + item + ": expected is_host=true|false|1|0"};
    } else if (std::find_if(std::begin(kUnusedRdzvKeys), std::end(kUnusedRdzvKeys),
                            [&](const char* known) { return key == known; }) !=
               std::end(kUnusedRdzvKeys)) {
      unused.push_back(key);
    } else {
      return Error{"--rdzv-conf " + item + ": unknown key; mcprun honours join_timeout, "
                   "last_call_timeout and is_host (and accepts torchrun's other keys)"};
    }
  }
  if (!unused.empty()) {
    std::string names;
    for (const std::string& key : unused) names += (names.empty() ? "" : ", ") + key;
    config.warnings.push_back("--rdzv-conf " + names + (unused.size() > 1 ? " are" : " is") +
                              " accepted for torchrun and unused by mcprun (it honours "
                              "join_timeout, last_call_timeout and is_host)");
  }
  return {};
}

/// Whether `option` reads a value (so the next argument is its value, not the script).
bool takes_value(const CLI::Option& option) { return option.get_type_size_max() > 0; }

/// argparse's allow_abbrev for the flags before the script: an unambiguous prefix of a long flag
/// ("--nproc_per=2", "--redirect 3") becomes that flag, spelled as typed ("-" or "_"). The names
/// are CLI11's own. An ambiguous prefix is a usage error naming the candidates.
Expected<std::vector<std::string>> expand_abbreviations(
    const CLI::App& app, const std::vector<std::string>& args) {
  const auto options = app.get_options();
  std::vector<std::string> expanded;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--" || arg.size() < 2 || arg[0] != '-') break;  // The script and its arguments.
    const CLI::Option* found = nullptr;
    std::string rewritten = arg;
    bool attached = false;
    if (arg[1] == '-') {
      const auto eq = arg.find('=');
      attached = eq != std::string::npos;
      const std::string name = arg.substr(2, attached ? eq - 2 : std::string::npos);
      std::vector<std::pair<const CLI::Option*, std::string>> matches;
      for (const CLI::Option* option : options) {
        for (const std::string& long_name : option->get_lnames()) {
          if (long_name == name) {
            found = option;
            break;
          }
        }
        if (found) break;
        // One match per option: both spellings of a flag are one flag. The spelling typed wins.
        std::optional<std::string> match;
        bool typed_match = false;
        for (const std::string& long_name : option->get_lnames()) {
          if (name.empty() || long_name.rfind(name, 0) != 0) continue;
          const bool typed_spelling = (name.find('_') == std::string::npos || long_name.find('-') == std::string::npos) &&
                                      (name.find('-') == std::string::npos || long_name.find('_') == std::string::npos);
          if (!match || (typed_spelling && !typed_match)) match = long_name;
          typed_match = typed_match || typed_spelling;
        }
        if (match) matches.emplace_back(option, *match);
      }
      if (!found && matches.size() > 1) {
        std::string names;
        for (const auto& match : matches) names += (names.empty() ? "--" : ", --") + match.second;
        return Error{"ambiguous option: --" + name + " could match " + names};
      }
      if (!found && matches.size() == 1) {
        found = matches.front().first;
        rewritten = "--" + matches.front().second + (attached ? arg.substr(eq) : "");
      }
    } else {
      for (const CLI::Option* option : options)
        for (const std::string& short_name : option->get_snames())
          if (short_name == arg.substr(1, 1)) found = option;
      attached = arg.size() > 2;  // "-n4"
    }
    if (!found) break;  // An unknown flag: CLI11 stops there and it is reported as unknown.
    expanded.push_back(rewritten);
    if (!attached && takes_value(*found) && i + 1 < args.size()) expanded.push_back(args[++i]);
  }
  expanded.insert(expanded.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return expanded;
}

}  // namespace

Expected<std::set<int>> parse_signal_list(const std::string& text) {
  std::set<int> signals;
  std::stringstream in(unquoted(text));
  for (std::string raw; std::getline(in, raw, ',');) {
    std::string name = unquoted(raw);
    if (name.empty()) continue;
    if (name.rfind("SIG", 0) != 0) name = "SIG" + name;
    auto known = std::find_if(std::begin(kHandledSignals), std::end(kHandledSignals),
                              [&](const auto& entry) { return name == entry.first; });
    if (known == std::end(kHandledSignals)) {
      std::string names;
      for (const auto& [signal_name, number] : kHandledSignals)
        names += (names.empty() ? "" : ", ") + std::string(signal_name);
      return Error{"--signals-to-handle " + unquoted(raw) + ": not a signal mcprun can handle; " +
                   "expected a comma-separated list of " + names};
    }
    signals.insert(known->second);
  }
  return signals;
}

std::string format_signal_list(const std::set<int>& signals) {
  std::string text;
  for (const auto& [name, number] : kHandledSignals)
    if (signals.contains(number)) text += (text.empty() ? "" : ",") + std::string(name);
  return text;
}

bool forwarded_only(int signal) { return signal == SIGUSR1 || signal == SIGUSR2; }

int StreamSpec::bits_for(int local_rank) const {
  auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? all : it->second;
}

std::optional<StreamSpec> parse_stream_spec(const std::string& text) {
  StreamSpec spec;
  if (auto bits = parse_int(text)) {
    if (*bits < 0 || *bits > 3) return std::nullopt;
    spec.all = *bits;
    return spec;
  }
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    auto colon = item.find(':');
    if (colon == std::string::npos) return std::nullopt;
    auto rank = parse_int(std::string_view(item).substr(0, colon));
    auto bits = parse_int(std::string_view(item).substr(colon + 1));
    if (!rank || !bits || *rank < 0 || *bits < 0 || *bits > 3) return std::nullopt;
    spec.per_rank[*rank] = *bits;
  }
  if (spec.per_rank.empty()) return std::nullopt;
  return spec;
}

namespace {

constexpr const char* kUsage =
    "mcprun: a native drop-in for torchrun. Spawns one fresh process per worker, pins each to\n"
    "one GPU in topology order, supervises the group and stops all of it on the first failure.\n\n"
    "usage: mcprun [flags] SCRIPT [ARGS...]    (ARGS pass through untouched)\n"
    "       mcprun topo                         (GPUs found and the rank mapping a launch uses)\n"
    "       mcprun store [--port N]             (a standalone c10d TCPStore server)";

constexpr const char* kExitCodesAndExamples =
    "\nExit codes: 0 every worker exited 0; 1-125 the first failing worker's own code; 1 mcprun\n"
    "could not proceed; 2 usage error; 3 the job stalled; 75 rendezvous failed or a node was lost;\n"
    "77 --preflight=fail found a fault; 124 --timeout passed; 128+N a worker died of, or mcprun\n"
    "was interrupted by, signal N.\n"
    "--summary-json's \"result\" (success|failed|stalled|timeout|interrupted) tells them apart.\n\n"
    "CI examples:\n"
    "  mcprun --config configs/ci-smoke.yaml          # a job file; flags given here override it\n"
    "  mcprun --config job.yaml -n 1 --timeout 120    # the same job, smaller and shorter\n"
    "  mcprun -n 2 --timeout 600 --init-timeout 60 --summary-json summary.json \\\n"
    "         --junit junit.xml train.py --epochs 1";

/// What the flags hold as text (or in a form LaunchConfig has no field for) until they are checked.
struct FlagTexts {
  std::string nproc = "1", redirects = "0", tee = "0", ranks_filter, bind = "none", gpus;
  std::string labels;
  std::optional<double> shutdown_timeout;
  std::string signals = kDefaultSignalsToHandle;
  std::string numa;
  std::string event_log_handler = "null";
  std::string logs_specs;
  std::string stdout_filters, stderr_filters;
  std::string job_file_path;
  std::string collective_timeout = "180";
  std::string straggler_window = "60";
  std::string preflight = "off";
  bool no_stack_dumps = false;
};

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
  add("nproc-per-node", texts.nproc, "Workers per node: N, cpu, gpu (GPU count; error if none) or "
      "auto (GPU count, else CPU count)", "-n");
  add("nnodes", config.nnodes, "Number of nodes: N, or MIN:MAX for an elastic job");
  add("node-rank", config.node_rank,
      "Rank of this node (static backend: default 0; rendezvous: assigned unless given)");
  add("master-addr", config.master_addr, "Address of the store that rank 0 hosts");
  add("master-port", config.master_port,
      "Port of that store (default: a free port, reserved so nothing else takes it)");
  flag("standalone", config.standalone, "Single-node job with a private store on a free port");
  add("rdzv-backend", config.rdzv_backend, "Rendezvous backend: static or c10d (one node: local)");
  add("rdzv-endpoint", config.rdzv_endpoint,
      "Rendezvous endpoint HOST:PORT ([IPV6]:PORT; c10d: a bare HOST is HOST:29400, as in "
      "torchrun); with the static backend it is the master's address and port, and beats "
      "--master-addr/--master-port");
  add("rdzv-id", config.rdzv_id, "Job id, exported as TORCHELASTIC_RUN_ID");
  add("rdzv-conf", config.rdzv_conf,
      "Rendezvous options key=value,... (outer quotes are stripped): join_timeout (default 120 s), "
      "last_call_timeout (default 5 s), is_host; torchrun's other keys are accepted and unused");
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
  flag("dry-run", config.dry_run, "Print each rank's GPU, CPUs, environment and argv; start nothing");
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

/// The command line, then a --config job file under it (the command line beats the file). An
/// InfoRequest or an error ends the parse; nullopt goes on.
std::optional<Expected<LaunchRequest>> parse_command_line(CLI::App& app,
                                                          const std::vector<std::string>& args,
                                                          const std::string& job_file_path,
                                                          JobFile& job) {
  auto expanded = expand_abbreviations(app, args);
  if (!expanded) return expanded.error();
  // CLI11 wants argv back to front.
  const std::vector<std::string> reversed(expanded->rbegin(), expanded->rend());
  try {
    app.parse(std::vector<std::string>(reversed));
    if (!job_file_path.empty()) {
      auto loaded = apply_job_file(app, job_file_path);
      if (!loaded) return loaded.error();
      job = std::move(*loaded);
      app.parse(std::vector<std::string>(reversed));  // The command line beats the file.
      std::erase_if(job.flag_lines, [&](const auto& flag) { return app.count("--" + flag.first) > 0; });
    }
  } catch (const CLI::CallForHelp&) {
    return LaunchRequest{InfoRequest{app.help()}};
  } catch (const CLI::CallForVersion&) {
    return LaunchRequest{InfoRequest{"mcprun " + mcprun_version() + "\n"}};
  } catch (const CLI::ParseError& error) {
    return Error{error.what()};
  }
  return std::nullopt;
}

/// The script and its arguments: the command line's, else the job file's.
Expected<void> take_script(const CLI::App& app, const JobFile& job, LaunchConfig& config) {
  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
  if (rest.empty() && job.script) {  // The command line names no script: the file's, with its args.
    rest = {*job.script};
    rest.insert(rest.end(), job.script_args.begin(), job.script_args.end());
  }
  config.env = job.env;
  if (rest.empty()) return Error{"no training script given (usage: mcprun [flags] SCRIPT [ARGS...])"};
  if (rest.front().size() > 1 && rest.front()[0] == '-')
    return Error{"unknown flag " + rest.front() + " (see mcprun --help)"};
  config.script = rest.front();
  config.script_args.assign(rest.begin() + 1, rest.end());
  return {};
}

/// --nproc-per-node, --redirects, --tee, --local-ranks-filter, --gpus and --bind, checked.
Expected<void> apply_worker_texts(const FlagTexts& texts, LaunchConfig& config) {
  auto nproc = parse_nproc(texts.nproc);
  if (texts.nproc == "xpu")
    return Error{"--nproc-per-node xpu: mcprun pins NVIDIA GPUs only; expected a count, cpu, gpu or auto"};
  if (!nproc)
    return Error{"--nproc-per-node " + texts.nproc + ": expected a count >= 1, cpu, gpu or auto"};
  config.nproc = *nproc;

  auto redirects = parse_stream_spec(texts.redirects);
  if (!redirects) return Error{"--redirects " + texts.redirects + ": expected 0-3 or LOCAL_RANK:0-3,..."};
  config.redirects = *redirects;
  auto tee = parse_stream_spec(texts.tee);
  if (!tee) return Error{"--tee " + texts.tee + ": expected 0-3 or LOCAL_RANK:0-3,..."};
  config.tee = *tee;

  if (!texts.ranks_filter.empty()) {
    config.local_ranks_filter = parse_rank_list(texts.ranks_filter);
    if (!config.local_ranks_filter)
      return Error{"--local-ranks-filter " + texts.ranks_filter + ": expected local ranks like 0,3"};
  }
  if (!texts.gpus.empty()) config.gpus = texts.gpus;
  config.bind = texts.bind == "numa" ? LaunchConfig::CpuBind::kNuma : LaunchConfig::CpuBind::kNone;
  return {};
}

/// --nnodes as MIN:MAX, --node-rank within it, and the rendezvous an elastic job needs.
Expected<void> apply_node_counts(LaunchConfig& config) {
  auto colon = config.nnodes.find(':');
  auto min_nodes = parse_int(std::string_view(config.nnodes).substr(0, colon));
  auto max_nodes = colon == std::string::npos
                       ? min_nodes
                       : parse_int(std::string_view(config.nnodes).substr(colon + 1));
  if (!min_nodes || !max_nodes || *min_nodes < 1 || *max_nodes < *min_nodes)
    return Error{"--nnodes " + config.nnodes + ": expected N or MIN:MAX with 1 <= MIN <= MAX"};
  config.min_nodes = *min_nodes;
  config.max_nodes = *max_nodes;
  // --standalone is a private store on loopback that no other node can reach (torchrun's private
  // rendezvous on localhost:0 waits out its join timeout for a node that never comes).
  if (config.standalone && config.max_nodes > 1)
    return Error{"--standalone is a one-node job, but --nnodes " + config.nnodes +
           " asks for up to " + std::to_string(config.max_nodes) + " nodes: drop --standalone "
           "(and join the nodes through --rdzv-backend c10d --rdzv-endpoint HOST:PORT) or use "
           "--nnodes 1"};
  if (config.node_rank && (*config.node_rank < 0 || *config.node_rank >= config.max_nodes))
    return Error{"--node-rank " + std::to_string(*config.node_rank) + ": expected 0-" +
           std::to_string(config.max_nodes - 1)};
  if (config.rdzv_backend == "static" && config.min_nodes != config.max_nodes)
    return Error{"--nnodes " + config.nnodes + ": an elastic MIN:MAX job needs "
           "--rdzv-backend c10d and --rdzv-endpoint"};
  if (config.uses_rendezvous() && config.rdzv_endpoint.empty())
    return Error{"--nnodes " + config.nnodes + " with --rdzv-backend " + config.rdzv_backend +
           " needs --rdzv-endpoint HOST:PORT"};
  return {};
}

/// A c10d --rdzv-endpoint in full: torchrun's c10d backend reads a bare HOST as HOST:29400, so
/// every later reader (client, embedded host, doctor) sees one form.
Expected<void> complete_c10d_endpoint(LaunchConfig& config) {
  if (config.rdzv_backend != "c10d" || config.rdzv_endpoint.empty()) return {};
  auto endpoint = parse_endpoint(unquoted(config.rdzv_endpoint), kC10dRules);
  if (!endpoint) return Error{"--rdzv-endpoint " + endpoint.error().message};
  config.rdzv_endpoint = endpoint->text();
  return {};
}

/// --metrics-port in full: a bare PORT listens on loopback, so that metrics are opt-in twice.
Expected<void> complete_metrics_port(LaunchConfig& config) {
  if (config.metrics_port.empty() || config.metrics_port.find(':') != std::string::npos) return {};
  auto port = parse_port(config.metrics_port);
  if (!port) return Error{"--metrics-port " + port.error().message};
  config.metrics_port = "127.0.0.1:" + std::to_string(*port);
  return {};
}

/// --topology-labels key=value,...
Expected<void> apply_topology_labels(const std::string& text, LaunchConfig& config) {
  if (text.empty()) return {};
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      return Error{"--topology-labels " + text + ": expected key=value,..."};
    config.topology_labels[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return {};
}

/// Static backend: --rdzv-endpoint names the master, as torchrun's static rendezvous reads it.
bool endpoint_names_static_master(const LaunchConfig& config) {
  return config.rdzv_backend == "static" && !config.standalone && !config.rdzv_endpoint.empty();
}

/// The static master from --rdzv-endpoint, over --master-addr and --master-port (with a warning).
Expected<void> apply_static_master(const CLI::App& app, LaunchConfig& config) {
  // Port 0, as for a listener: the master reserves a free one.
  auto endpoint = parse_endpoint(unquoted(config.rdzv_endpoint), kListenRules);
  if (!endpoint)
    return Error{"--rdzv-endpoint " + endpoint.error().message + " (the static backend's master)"};
  if (app.count("--master-addr") > 0 && config.master_addr != endpoint->host)
    config.warnings.push_back("--master-addr " + config.master_addr + " is ignored: --rdzv-endpoint " +
                              config.rdzv_endpoint + " names the master (as in torchrun)");
  if (config.master_port && *config.master_port != endpoint->port)
    config.warnings.push_back("--master-port " + std::to_string(*config.master_port) +
                              " is ignored: --rdzv-endpoint " + config.rdzv_endpoint +
                              " names the master (as in torchrun)");
  config.master_addr = endpoint->host;
  config.master_port = endpoint->port;
  if (*config.master_port == 0) config.master_port.reset();  // Port 0: a free one.
  return {};
}

/// MASTER_PORT's default and range, the backend, and flags that contradict each other.
Expected<void> check_master_and_backend(LaunchConfig& config) {
  // Static multi-node: every node must agree on the port, so torchrun's fixed default applies.
  if (config.max_nodes > 1 && config.rdzv_backend == "static" && !config.master_port)
    config.master_port = 29500;
  if (config.master_port && (*config.master_port < 1 || *config.master_port > 65535))
    return Error{"--master-port " + std::to_string(*config.master_port) + ": expected 1-65535"};
  if (config.rdzv_backend != "static" && config.rdzv_backend != "c10d")
    return Error{"--rdzv-backend " + config.rdzv_backend + ": expected static or c10d"};
  if (config.module && config.no_python) return Error{"--module and --no-python cannot be used together"};
  if (config.start_method != "spawn")
    config.warnings.push_back("--start-method " + config.start_method +
                              " is ignored: every worker is a fresh exec'ed process (spawn)");
  return {};
}

/// --signals-to-handle and --numa-binding, checked.
Expected<void> apply_signals_and_binding(const FlagTexts& texts, LaunchConfig& config) {
  auto signals = parse_signal_list(texts.signals);
  if (!signals) return signals.error();
  config.signals_to_handle = *signals;
  if (!texts.numa.empty()) {
    config.numa_binding = parse_numa_binding(texts.numa);
    if (!config.numa_binding)
      return Error{"--numa-binding " + texts.numa + ": expected node, socket, exclusive or core-complex"};
  }
  return {};
}

/// torchrun's flags that mcprun accepts only at their defaults: a warning or a usage error.
Expected<void> check_accepted_torchrun_flags(const FlagTexts& texts, LaunchConfig& config) {
  if (texts.event_log_handler != "null")
    config.warnings.push_back("--event-log-handler " + texts.event_log_handler +
                              " is ignored: mcprun has no event log handlers");
  if (!texts.logs_specs.empty() && texts.logs_specs != "default")
    return Error{"--logs-specs " + texts.logs_specs + ": mcprun has only torchrun's default "
           "LogsSpecs (default); its logs are laid out by --log-dir, --redirects and --tee"};
  for (const auto* filters : {&texts.stdout_filters, &texts.stderr_filters})
    if (!unquoted(*filters).empty())
      return Error{std::string(filters == &texts.stdout_filters ? "--duplicate-stdout-filters "
                                                          : "--duplicate-stderr-filters ") +
             *filters + ": mcprun does not copy matching lines to a second file; keep "
             "every line with --log-dir and grep its stdout.log/stderr.log"};
  return {};
}

/// --term-timeout unless given: --shutdown-timeout, else TORCH_ELASTIC_SHUTDOWN_TIMEOUT.
Expected<void> resolve_term_timeout(const CLI::App& app, const JobFile& job,
                                    const FlagTexts& texts, LaunchConfig& config) {
  if (app.count("--term-timeout") > 0 || job.flag_lines.contains("term-timeout") ||
      std::getenv("PET_TERM_TIMEOUT") != nullptr)
    return {};
  if (texts.shutdown_timeout) {
    config.term_timeout = *texts.shutdown_timeout;
  } else if (const char* torch_timeout = std::getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")) {
    char* end = nullptr;
    const double seconds = std::strtod(torch_timeout, &end);
    if (!*torch_timeout || *end != '\0' || !(seconds >= 0))
      return Error{std::string("TORCH_ELASTIC_SHUTDOWN_TIMEOUT=") + torch_timeout +
             ": expected seconds >= 0"};
    config.term_timeout = seconds;
  }
  return {};
}

/// torchrun reads the template from its own environment (a job file's env: counts as exported).
void resolve_log_line_prefix(const JobFile& job, LaunchConfig& config) {
  const char* prefix_template = std::getenv(kLogLinePrefixTemplateVariable);
  if (auto it = job.env.find(kLogLinePrefixTemplateVariable); it != job.env.end())
    prefix_template = it->second.c_str();
  if (prefix_template && *prefix_template) config.log_line_prefix_template = prefix_template;
}

/// MASTER_ADDR: loopback when standalone, else --local-addr unless the master was named.
void resolve_master_addr(const CLI::App& app, const JobFile& job, bool static_master,
                         LaunchConfig& config) {
  if (config.standalone) config.master_addr = "127.0.0.1";
  else if (!static_master && !config.local_addr.empty() && app.count("--master-addr") == 0 &&
           !job.flag_lines.contains("master-addr") && std::getenv("PET_MASTER_ADDR") == nullptr)
    config.master_addr = config.local_addr;
}

/// parse_launch_config, recording in `job` what a --config job file set.
Expected<LaunchRequest> parse_arguments(const std::vector<std::string>& args, JobFile& job) {
  LaunchConfig config;
  CLI::App app{kUsage, "mcprun"};
  app.prefix_command();  // Everything from the script on belongs to the script.
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", "mcprun " + mcprun_version());
  app.footer(kExitCodesAndExamples);

  FlagTexts texts;
  add_job_shape_flags(app, config, texts);
  add_worker_flags(app, config);
  add_output_flags(app, config, texts);
  add_shutdown_flags(app, config, texts);
  add_binding_flags(app, config, texts);
  add_accepted_torchrun_flags(app, texts);
  add_ci_flags(app, config, texts);
  add_diagnosis_flags(app, config, texts);
  add_launcher_flags(app, config, texts);

  if (auto ended = parse_command_line(app, args, texts.job_file_path, job)) return *ended;
  if (auto done = take_script(app, job, config); !done) return done.error();
  config.stack_dumps = !texts.no_stack_dumps;
  config.preflight = texts.preflight == "fail" ? LaunchConfig::Preflight::kFail
                     : texts.preflight == "warn" || texts.preflight == "true"
                         ? LaunchConfig::Preflight::kWarn
                         : LaunchConfig::Preflight::kOff;
  config.stall.collective_timeout =
      texts.collective_timeout == "off" ? 0 : std::stod(texts.collective_timeout);
  config.stall.stragglers.window_s =
      texts.straggler_window == "off" ? 0 : std::stod(texts.straggler_window);
  if (auto done = apply_worker_texts(texts, config); !done) return done.error();

  // Under srun: what the step says, wherever the user set nothing (see launcher/config/slurm.hpp).
  auto set_by_user = [&](const std::string& dashed) {
    return app.count("--" + dashed) > 0 || job.flag_lines.contains(dashed) ||
           std::getenv(env_name_for(dashed).c_str()) != nullptr;
  };
  if (auto done = apply_slurm(config, current_environment(), set_by_user); !done) return done.error();
  if (auto done = apply_node_counts(config); !done) return done.error();
  if (auto done = complete_c10d_endpoint(config); !done) return done.error();
  if (auto done = complete_metrics_port(config); !done) return done.error();
  if (auto done = apply_rdzv_conf(config.rdzv_conf, config); !done) return done.error();
  if (auto done = apply_topology_labels(texts.labels, config); !done) return done.error();
  const bool static_master = endpoint_names_static_master(config);
  if (static_master)
    if (auto done = apply_static_master(app, config); !done) return done.error();
  if (auto done = check_master_and_backend(config); !done) return done.error();
  if (auto done = apply_signals_and_binding(texts, config); !done) return done.error();
  if (auto done = check_accepted_torchrun_flags(texts, config); !done) return done.error();
  if (auto done = resolve_term_timeout(app, job, texts, config); !done) return done.error();
  resolve_log_line_prefix(job, config);
  resolve_master_addr(app, job, static_master, config);
  return LaunchRequest{std::move(config)};
}

}  // namespace

Expected<LaunchRequest> parse_launch_config(const std::vector<std::string>& args) {
  JobFile job;
  auto result = parse_arguments(args, job);
  // A file's value that CLI11 took and mcprun's own checks refused is still named at its line.
  if (!result) return Error{job.locate(result.error().message)};
  return result;
}

}  // namespace mcprun
