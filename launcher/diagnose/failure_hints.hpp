// Root-cause hints: the failure signatures the field knows (one table, failure_hints.cpp), each
// turned into one line that says what it means for this job: its GPUs, its pinning, /dev/shm,
// its interface, its master port.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/proc_sockets.hpp"
#include "common/topology.hpp"

namespace mcprun {

/// One local rank, as the hints need it.
struct HintRank {
  int local_rank = 0;  ///< The LOCAL_RANK it was given (0 for all under --virtual-local-rank).
  int pid = 0;
  /// Its CUDA_VISIBLE_DEVICES entries, in CUDA's order; empty when mcprun did not pin it.
  std::vector<std::string> visible_gpus;
};

/// What this node's part of the job knows that turns a signature into a cause.
struct HintJob {
  std::vector<GpuDevice> node_gpus;  ///< Every GPU found on this node, UUIDs included.
  std::map<int, HintRank> ranks;     ///< This node's ranks, by global rank.
  bool pinned = false;               ///< mcprun gave each rank CUDA_VISIBLE_DEVICES.
  bool no_pin = false;               ///< --no-pin was given.
  /// CUDA_VISIBLE_DEVICES as mcprun inherited it; every unpinned rank inherits it too.
  std::optional<std::string> inherited_visible_devices;
  /// NCCL_SOCKET_IFNAME as the workers got it; empty: NCCL picked an interface itself.
  std::string socket_interface;
  int master_port = 0;
  /// When this node's ranks that exited 0 did so, and when the failing rank failed: a peer that
  /// finished early is the likely cause of a lost connection.
  std::map<int, std::chrono::system_clock::time_point> finished_at;
  /// Ranks whose interpreter was exiting (their script ended) when mcprun stopped them, and since.
  std::map<int, std::chrono::system_clock::time_point> exiting_at;
  std::chrono::system_clock::time_point failed_at;
};

/// A rank that exited 0 while its peers still ran collectives with it.
struct EarlyFinisher {
  int rank = 0;
  double seconds_before = 0;    ///< Before the failing rank failed.
  bool exit_code_known = true;  ///< It exited 0; else its interpreter was exiting.
};

/// How long before a lost peer a rank's clean exit still names it: gloo notices a closed peer at
/// its next collective with it, which a long step or an evaluation can put off.
inline constexpr std::chrono::seconds kEarlyFinisherWindow{60};

/// The rank that finished last before `rank` failed, when `lines` say `rank` lost a peer (gloo's
/// "Connection closed by peer", NCCL's remote-exit and closed-connection errors); nullopt
/// otherwise, or when no rank finished within kEarlyFinisherWindow before.
std::optional<EarlyFinisher> early_finisher(int rank, const std::vector<std::string>& lines,
                                            const HintJob& job);

/// Space on a file system, in bytes.
struct FileSystemSpace {
  std::uintmax_t free = 0;
  std::uintmax_t total = 0;
};

/// The system behind the hints, asked only when a signature matched; tests replace it.
struct HintProbes {
  std::function<std::optional<FileSystemSpace>()> shm_space;
  /// NVML's process list for a GPU: only the out-of-memory hint loads NVML.
  std::function<std::optional<std::vector<GpuProcess>>(const std::string& bus_id)> gpu_processes;
  std::function<std::optional<PortListener>(int port)> port_listener;
  std::function<std::string(int pid)> command_of;  ///< /proc/PID/comm; "" when gone.
  int own_pid = 0;                                 ///< mcprun's: it holds the master port.
};

/// The real system: statvfs(/dev/shm), NVML, /proc.
HintProbes system_hint_probes();

/// The one-line hint for the first recognised signature in `lines` (a rank's last output, then
/// what torch's @record wrote), for global rank `rank`; nullopt when no line matches one.
std::optional<std::string> failure_hint(int rank, const std::vector<std::string>& lines,
                                        const HintJob& job, const HintProbes& probes);

}  // namespace mcprun
