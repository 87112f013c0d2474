// `mcprun doctor`: a node's preflight checks, the causes of silent DDP hangs that FIELD.md lists
// (small /dev/shm, a bridge interface, a taken port, inherited variables, an x8 slot, ...), each
// with what was found and what to do about it.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/endpoint.hpp"
#include "common/expected.hpp"
#include "launcher/plan/worker_env.hpp"

namespace mcprun {

/// NCCL's shared-memory transport stalls below this much free /dev/shm (docker's default is 64 MB).
inline constexpr uint64_t kShmFailBelowBytes = 256ull << 20;
/// Below this an 8-GPU job's NCCL segments can still run /dev/shm out of space.
inline constexpr uint64_t kShmWarnBelowBytes = 1ull << 30;
/// How long a TCP connect to the master or the rendezvous may take before packets count as dropped.
inline constexpr std::chrono::milliseconds kDoctorConnectTimeout{3000};
/// How long the rendezvous may take to answer one clock request.
inline constexpr std::chrono::milliseconds kClockReplyTimeout{3000};
/// Clock requests per measurement; the one with the shortest round trip bounds the skew best.
inline constexpr int kClockSamples = 3;
/// Above this skew the nodes' logs and failure reports no longer line up.
inline constexpr std::chrono::milliseconds kClockWarnAbove{1000};
/// Above this the node is not time-synchronised at all (no NTP): whatever compares times across
/// machines (Kerberos/NFS tickets, TLS certificates, checkpoint timestamps) breaks with it.
inline constexpr std::chrono::milliseconds kClockFailAbove{30000};

/// How long the workers' python may take to import torch and report its NCCL (a cold import
/// from a network filesystem takes tens of seconds).
inline constexpr std::chrono::seconds kTorchProbeTimeout{60};
/// How long that python may take to exit once it has answered, before it is killed.
inline constexpr std::chrono::seconds kTorchProbeExitTimeout{5};

/// How a check came out; FAIL makes `mcprun doctor` exit 1.
enum class CheckStatus { kOk, kWarn, kFail };

/// "OK", "WARN" or "FAIL", as the report and --json spell it.
const char* status_name(CheckStatus status);
/// Whole seconds of a limit, for findings and --help: "3".
std::string seconds_text(std::chrono::milliseconds limit);

/// One finding of one check. A check with several findings (the environment, the GPUs) returns
/// one result per finding, so each gets its own line and its own remedy.
struct CheckResult {
  std::string name;  ///< "shm", "interface", "master-port", ...: stable, for scripts.
  CheckStatus status = CheckStatus::kOk;
  std::string finding;  ///< What was found, with the values that matter.
  std::string remedy;   ///< What to do; empty for OK.
};

/// The facts the checks judge that a test fixes outright: what the user asked to check and the
/// node's own state that needs no probe.
struct DoctorInputs {
  Environment env;  ///< The inherited environment.
  std::filesystem::path sysfs_root = "/sys";
  std::filesystem::path shm_path = "/dev/shm";
  std::string hostname;
  std::string master_addr;    ///< --master-addr, else MASTER_ADDR; empty: not given.
  std::string master_port;    ///< --master-port, else MASTER_PORT (text: it may be bad).
  std::string rdzv_endpoint;  ///< --rdzv-endpoint; empty: not given.
  std::optional<uint64_t> memlock_bytes;  ///< RLIMIT_MEMLOCK's soft limit; nullopt: unlimited.
  std::string python;  ///< The workers' interpreter, for the NCCL check; empty: skip it.
};

/// A filesystem's size as statvfs reports it.
struct FilesystemSpace {
  uint64_t total_bytes = 0;
  uint64_t available_bytes = 0;
};

/// What one TCP (or unix socket) connect attempt ended with.
struct ConnectResult {
  enum class Outcome { kConnected, kRefused, kTimedOut, kUnreachable } outcome = Outcome::kRefused;
  std::string error;  ///< strerror text for kUnreachable.
};

/// One comparison of this node's clock with the rendezvous's.
struct ClockReading {
  std::chrono::nanoseconds skew{0};  ///< Rendezvous minus this node; positive: we are behind.
  std::chrono::nanoseconds rtt{0};   ///< Of the sample used; the skew is known to +- rtt/2.
};

/// The NCCL the workers' torch uses, as that python reports it.
struct TorchNccl {
  std::string torch_version;           ///< torch.__version__.
  std::string cuda_version;            ///< torch.version.cuda; empty: a CPU build.
  std::string loaded;                  ///< ncclGetVersion of the library torch runs: "2.20.5".
  std::string load_error;              ///< Why torch could not report it, if it could not.
  std::vector<std::string> libraries;  ///< Every libnccl mapped into that process.
  std::string shipped;                 ///< The nvidia-nccl-cu* package torch depends on, if any.
};

/// The OS seam: every probe of the live system the checks make, so tests can fake each answer.
class DoctorProbes {
 public:
  virtual ~DoctorProbes() = default;
  /// statvfs of `path`; an error line (naming the call) when it fails.
  virtual Expected<FilesystemSpace> filesystem_space(const std::filesystem::path& path) = 0;
  /// Numeric addresses of `host`, IPv4 first; an error line when it does not resolve.
  virtual Expected<std::vector<std::string>> resolve(const std::string& host) = 0;
  /// The source address the kernel would use towards `address` (a connected UDP socket's local
  /// end: no packet is sent); nullopt without a route.
  virtual std::optional<std::string> source_address(const std::string& address) = 0;
  /// The interface holding `local_address`; nullopt when none does (so it is not local).
  virtual std::optional<std::string> interface_of(const std::string& local_address) = 0;
  /// Every network interface's name.
  virtual std::vector<std::string> interface_names() = 0;
  /// 0 when a plain bind (no SO_REUSEADDR) of the wildcard address to `port` succeeds, else errno.
  virtual int bind_error(int port) = 0;
  /// The process listening on TCP `port` ("pid 412 (python3)"); "" when something listens but
  /// its owner is hidden; nullopt when nothing listens.
  virtual std::optional<std::string> listener_on(int port) = 0;
  /// A TCP (or unix socket) connect that gives up after `limit`; the connection is closed again.
  virtual ConnectResult connect(const Endpoint& endpoint, std::chrono::milliseconds limit) = 0;
  /// Asks the rendezvous for its clock kClockSamples times, a connection each (the daemon answers
  /// one clock per connection that has not joined); an error line when it cannot.
  virtual Expected<ClockReading> read_clock(const Endpoint& endpoint) = 0;
  /// Runs `python` under `env` to import torch and ask it for its NCCL, up to
  /// kTorchProbeTimeout; an error line when it cannot.
  virtual Expected<TorchNccl> torch_nccl(const std::string& python, const Environment& env) = 0;
  /// The address of a Slurm node that getaddrinfo does not know: its NodeAddr (scontrol show
  /// node), as mcprun itself falls back to; nullopt when Slurm does not know it either.
  virtual std::optional<std::string> slurm_node_address(const std::string& node);
};

/// The real system: statvfs, getaddrinfo, sockets, /proc.
class SystemDoctorProbes : public DoctorProbes {
 public:
  Expected<FilesystemSpace> filesystem_space(const std::filesystem::path& path) override;
  Expected<std::vector<std::string>> resolve(const std::string& host) override;
  std::optional<std::string> source_address(const std::string& address) override;
  std::optional<std::string> interface_of(const std::string& local_address) override;
  std::vector<std::string> interface_names() override;
  int bind_error(int port) override;
  std::optional<std::string> listener_on(int port) override;
  ConnectResult connect(const Endpoint& endpoint, std::chrono::milliseconds limit) override;
  Expected<ClockReading> read_clock(const Endpoint& endpoint) override;
  Expected<TorchNccl> torch_nccl(const std::string& python, const Environment& env) override;
};

/// 1. /dev/shm's free space against kShmFailBelowBytes / kShmWarnBelowBytes.
CheckResult check_shm(const DoctorInputs& inputs, DoctorProbes& probes);
/// 2. The interface that routes to the master (or the rendezvous): lo and bridges are suspect.
CheckResult check_interface(const DoctorInputs& inputs, DoctorProbes& probes);
/// 3a. MASTER_PORT: free here when the master is this node, else reachable. Empty when not given.
std::vector<CheckResult> check_master_port(const DoctorInputs& inputs, DoctorProbes& probes);
/// 3b. The rendezvous endpoint answers. Empty when not given.
std::vector<CheckResult> check_rdzv_endpoint(const DoctorInputs& inputs, DoctorProbes& probes);
/// 4. Inherited variables that mcprun replaces or that change NCCL, each with its effect.
std::vector<CheckResult> check_environment(const DoctorInputs& inputs, DoctorProbes& probes);
/// 5. GPUs: count, NUMA affinity, PCIe link below its maximum.
std::vector<CheckResult> check_gpus(const DoctorInputs& inputs);
/// 6. RLIMIT_MEMLOCK: RDMA pins memory.
CheckResult check_memlock(const DoctorInputs& inputs);
/// 7. The hostname must not resolve to loopback.
CheckResult check_hostname(const DoctorInputs& inputs, DoctorProbes& probes);
/// 8. Clock skew against the rendezvous. Empty when no --rdzv-endpoint.
std::vector<CheckResult> check_clock(const DoctorInputs& inputs, DoctorProbes& probes);
/// 9. The NCCL torch runs against the one it ships with: a system libnccl picked up through
/// LD_LIBRARY_PATH or LD_PRELOAD is a known cause of silent stalls. Empty when no python is set.
std::vector<CheckResult> check_nccl(const DoctorInputs& inputs, DoctorProbes& probes);

/// 10. Inside a Slurm step: what mcprun would take from it (nnodes, node rank, master and port,
/// run id, GPUs), whether the first node's address answers, and a WARN for more than one task per
/// node. A WARN in a Slurm job outside any step; empty outside Slurm.
std::vector<CheckResult> check_slurm(const DoctorInputs& inputs, DoctorProbes& probes);

/// Every check, in the order the report prints them.
std::vector<CheckResult> run_checks(const DoctorInputs& inputs, DoctorProbes& probes);

/// The report: "OK|WARN|FAIL  <check>: <finding>", an indented remedy under WARN/FAIL, a summary.
std::string format_doctor_text(const std::vector<CheckResult>& results, bool colour);
/// {"checks": [{check, status, finding, remedy}],
///  "summary": {ok, warn, fail, exit_code, mcprun_version}}.
std::string format_doctor_json(const std::vector<CheckResult>& results);
/// 1 when any check FAILed, else 0.
int doctor_exit_code(const std::vector<CheckResult>& results);

/// Runs `mcprun doctor [flags]` (`args` without "doctor") on this node; returns the exit code:
/// 0 when nothing FAILed, 1 when something did, 2 for bad flags.
int run_doctor(const std::vector<std::string>& args);

}  // namespace mcprun
