// The exit codes mcprun documents; scripts and CI branch on these, so they never change meaning.
#pragma once

#include <cstdio>
#include <string>

namespace mcprun {

/// Process exit codes. A failing worker's own code (1..125) is passed through unchanged.
enum ExitStatus : int {
  kExitSuccess = 0,
  kExitFailure = 1,  ///< A launcher-side failure that is not the user's input (e.g. spawn failed).
  kExitUsage = 2,    ///< Bad flags or input: one line on stderr says which.
  kExitStalled = 3,  ///< A stall watchdog fired (init barrier, timer, heartbeat, barrier, silence).
  kExitRendezvous = 75,  ///< Rendezvous failed or a node was lost (EX_TEMPFAIL: retrying may work).
  /// Under Slurm, SIGTERM (scancel, the time limit, preemption) stopped the group: not a worker's
  /// failure, so a --requeue batch script can requeue on it.
  kExitSlurmCancelled = 76,
  /// --preflight=fail found a slow or dead rank, node or link: the script never started.
  kExitPreflightFailed = 77,
  kExitJobTimeout = 124,  ///< --timeout passed before the job ended (as timeout(1) reports it).
  kExitSignalBase = 128   ///< 128 + N: a worker died of signal N, or mcprun was interrupted by N.
};

/// Bad input: one line "mcprun: error: ..." on stderr; returns kExitUsage.
inline int usage_error(const std::string& message) {
  std::fprintf(stderr, "mcprun: error: %s\n", message.c_str());
  return kExitUsage;
}

/// 128 + signal, as shells report a signal death.
constexpr int exit_code_for_signal(int signal_number) { return kExitSignalBase + signal_number; }

}  // namespace mcprun
