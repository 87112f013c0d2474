// What the user asked for: torchrun's command line (both spellings, PET_* variables) parsed once.
#pragma once

#include <csignal>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "common/cpu_topology.hpp"
#include "common/endpoint.hpp"
#include "common/expected.hpp"

namespace mcprun {

/// The stall watchdogs' limits, in seconds.
/// When a rank is named a straggler (--straggler-* flags; docs/stalls.md says why these).
struct StragglerSettings {
  double window_s = 60;         ///< Judged over this much of the job; 0: off.
  double min_cost_share = 0.1;  ///< The others spent this share of the window waiting for it,
  double min_share = 0.05;      ///< and it held them back at this share of the steps at least:
  double min_lag_s = 0.01;      ///< last by at least this much,
  double min_step_share = 0.1;  ///< and by at least this share of a step.
  /// A kind of collective is slow under this share of its bus bandwidth earlier in the job
  /// (or of --preflight's floor),
  double slow_collective_share = 0.5;
  double slow_collective_min_s = 0.02;  ///< where one takes this long at least (the mean).
};

struct StallSettings {
  double init_timeout = 120;       ///< --init-timeout: the whole world past the init barrier.
  double heartbeat_timeout = 300;  ///< --heartbeat-timeout: for ranks that called heartbeat().
  double silence_timeout = 0;      ///< --silence-timeout: no output for this long; 0 = off.
  /// --collective-timeout: no collective completes and no rank outside one is busy, while one is
  /// pending, for this long; 0 = off ("off" on the command line). docs/stalls.md says why 180.
  double collective_timeout = 180;
  /// The straggler watch, which the collective watchdog's progress records feed.
  StragglerSettings stragglers;
  /// TORCH_DIST_INIT_BARRIER is not "0", so torch runs its store barrier at init.
  bool torch_init_barrier = true;
};

/// Which of a worker's streams go to files only (redirect) or to files and console (tee).
/// Bit 1 is stdout and bit 2 is stderr, as in torchrun's "0|1|2|3" and "rank:value" maps.
struct StreamSpec {
  int all = 0;                  ///< Applies to every local rank not in per_rank.
  std::map<int, int> per_rank;  ///< local rank -> bits.
  int bits_for(int local_rank) const;
};

/// How many workers per node: a number, or torchrun's cpu|gpu|auto, resolved once GPUs are known.
struct NprocSpec {
  enum class Kind { kCount, kCpu, kGpu, kAuto } kind = Kind::kCount;
  int count = 1;
};

/// Every launch setting, with its default. Defaults here are the ones `--help` shows.
struct LaunchConfig {
  NprocSpec nproc;
  std::string nnodes = "1";
  int min_nodes = 1, max_nodes = 1;  ///< From --nnodes N or MIN:MAX.
  std::optional<int> node_rank;  ///< nullopt: 0 for static, assigned by the rendezvous otherwise.
  std::string master_addr = "127.0.0.1";
  std::optional<int> master_port;  ///< nullopt: reserve a free one (see PortReservation).
  bool standalone = false;
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::string metrics_port;  ///< --metrics-port as IP:PORT (a bare PORT on 127.0.0.1); empty: off.
  std::string rdzv_id = "none";
  std::string rdzv_conf;
  double join_timeout = 120;     ///< rdzv-conf join_timeout, seconds (torchrun: 600).
  double last_call_timeout = 5;  ///< rdzv-conf last_call_timeout, seconds (torchrun: 30).
  std::optional<bool> is_host;   ///< rdzv-conf is_host; nullopt: guess from the endpoint.
  /// The etcd backends' rdzv-conf: protocol=https, and the CA, certificate and key files.
  struct EtcdTls {
    bool https = false;
    std::string cacert, cert, key;
  } etcd_tls;
  /// Whether --rdzv-backend names an etcd cluster (etcd or etcd-v2; both speak etcd's v3 API).
  bool uses_etcd() const { return rdzv_backend == "etcd" || rdzv_backend == "etcd-v2"; }
  std::map<std::string, std::string> topology_labels;
  std::string node_name;        ///< Unique per job; default <hostname>:<pid>.
  std::string rdzv_token_file;  ///< Token presented to rendezvousd, when it asks for one.
  int max_restarts = 0;
  double monitor_interval = 0.1;  ///< Accepted for compatibility; exits are event-driven.
  std::string start_method = "spawn";
  std::string role = "default";
  bool module = false;
  bool no_python = false;
  bool run_path = false;
  std::string log_dir;
  StreamSpec redirects;
  StreamSpec tee;
  std::optional<std::set<int>> local_ranks_filter;  ///< nullopt: every rank on the console.
  std::string local_addr;
  double term_timeout = 10.0;  ///< Seconds between SIGTERM and SIGKILL when stopping.
  double job_timeout = 0;      ///< --timeout: wall-clock limit for the whole job; 0 = none.
  double gpu_wait = 0;         ///< --gpu-wait: how long to wait for a GPU lease; 0 = fail at once.
  bool nccl_debug = false;     ///< --nccl-debug: NCCL/torch distributed debug logging.
  StallSettings stall;         ///< --init-timeout, --collective-timeout, ... .
  bool stack_dumps = true;     ///< On a stall, dump stacks before stopping (--no-stack-dumps).
  /// --preflight: a collective check over the job's ranks before the script; fail stops the launch.
  enum class Preflight { kOff, kWarn, kFail } preflight = Preflight::kOff;
  double preflight_timeout = 10;   ///< --preflight-timeout: each preflight step's deadline.
  double preflight_min_busbw = 0;  ///< --preflight-min-busbw, GB/s: a floor; 0: none.
  bool dry_run = false;
  bool no_pin = false;
  bool virtual_local_rank = false;  ///< --virtual-local-rank: one visible GPU, LOCAL_RANK=0.
  std::optional<std::string> gpus;  ///< --gpus subset, CUDA_VISIBLE_DEVICES syntax.
  enum class CpuBind { kNone, kNuma } bind = CpuBind::kNone;
  /// --numa-binding: torchrun 2.x's CPU sets per GPU (node, socket, exclusive, core-complex);
  /// nullopt: not asked for (see also --bind).
  std::optional<NumaBinding> numa_binding;
  /// --signals-to-handle: what mcprun catches. The stopping ones stop the group; SIGUSR1/2 are
  /// only forwarded to every worker.
  std::set<int> signals_to_handle{SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  /// TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: the console prefix with ${rank}, ${local_rank} and
  /// ${role_name}; nullopt: mcprun's "[rankN]:".
  std::optional<std::string> log_line_prefix_template;
  bool verbose = false;
  std::map<std::string, std::string>
      env;                   ///< The job file's env:, added to every worker's environment.
  std::string summary_json;  ///< --summary-json: how the job ended, as JSON, for CI.
  std::string junit;         ///< --junit: one JUnit test case per rank, for CI.

  /// More than one node through rendezvousd; static multi-node needs no rendezvous.
  bool uses_rendezvous() const { return max_nodes > 1 && rdzv_backend != "static"; }

  std::string script;                    ///< Script, module or executable.
  std::vector<std::string> script_args;  ///< Passed through untouched.
  std::vector<std::string> warnings;     ///< Non-fatal remarks to log before launching.
  std::vector<std::string> notes;  ///< Info lines to log before launching (what came from Slurm).
  bool no_slurm = false;           ///< --no-slurm / MCPRUN_SLURM=0: ignore SLURM_* variables.
  bool under_slurm = false;  ///< Settings came from a Slurm step: a SIGTERM is Slurm's cancel.
};

/// `--help` or `--version`: text to print and exit 0.
struct InfoRequest {
  std::string text;
};

/// What a good command line asks for: a launch, or only text to print.
using LaunchRequest = std::variant<LaunchConfig, InfoRequest>;

/// Parses argv (without the subcommand) against the environment, for `PET_*` fallbacks, and
/// the --config job file (the command line beats the file, which beats PET_* variables). Every
/// error is bad input: the caller exits with kExitUsage.
Expected<LaunchRequest> parse_launch_config(const std::vector<std::string>& args);

/// The variable torchrun 2.x reads the console prefix from; mcprun reads it for itself.
inline constexpr const char* kLogLinePrefixTemplateVariable =
    "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE";

/// torchrun's default --signals-to-handle.
inline constexpr const char* kDefaultSignalsToHandle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";

/// Parses --signals-to-handle ("SIGTERM,SIGUSR1", the SIG optional); an unknown or uncatchable
/// name is an error naming it.
Expected<std::set<int>> parse_signal_list(const std::string& text);

/// The list as torchrun passes it to workers (TORCHELASTIC_SIGNALS_TO_HANDLE): names, in the
/// order of the default list first.
std::string format_signal_list(const std::set<int>& signals);

/// A signal mcprun only forwards to every worker, without stopping the group (SIGUSR1/2).
bool forwarded_only(int signal);

/// Parses "3" or "0:1,2:3" (torchrun's --redirects/--tee syntax); nullopt when malformed.
std::optional<StreamSpec> parse_stream_spec(const std::string& text);

/// etcd's client port, which a bare etcd HOST gets.
inline constexpr int kEtcdDefaultPort = 2379;
/// The etcd members --rdzv-endpoint names: "e1:2379,e2,https://e3:2379"; the error, one line.
Expected<std::vector<Endpoint>> etcd_members(const std::string& endpoints);

}  // namespace mcprun
