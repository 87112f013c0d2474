// Whether a process runs at all, from /proc: a rank stopped by a signal or a debugger, or stuck in
// the kernel, is a different failure from one that runs and makes no progress.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace mcprun {

/// A process's scheduling state as /proc shows it.
struct ProcessRunState {
  char state = '?';   ///< /proc/PID/stat's third field: R, S, D, T, t, Z...
  std::string wchan;  ///< /proc/PID/wchan: the kernel function it waits in; "" or "0": none.
  double cpu_s = 0;   ///< CPU time its threads used, user and system.
};

/// What the kernel counts of a process: whether it computes, and whether it computes while a
/// loaded box gives it little CPU. Its main thread runs the script; its other threads (the
/// progress reporter, gloo's) are left out of all but `cpu_s`.
struct ProcessActivity {
  double cpu_s = 0;              ///< Its threads' CPU time, user and system (/proc/PID/stat).
  double main_run_s = -1;        ///< Its main thread's time on a CPU; -1: not counted.
  double main_run_delay_s = -1;  ///< Its main thread's time runnable, waiting for a CPU.
  int64_t main_io_bytes =
      -1;  ///< Bytes its main thread's system calls read and wrote; -1: not counted.
};

/// A thread's /proc/PID/task/TID/schedstat: "<ns on a CPU> <ns waiting for one> <timeslices>",
/// as seconds on a CPU and seconds waiting; nullopt for other text.
std::optional<std::pair<double, double>> parse_schedstat(std::string_view text);

/// A thread's /proc/PID/task/TID/io: its rchar plus its wchar; nullopt where either is missing.
std::optional<int64_t> parse_io_bytes(std::string_view text);

/// /proc's counts of `pid` and its main thread; nullopt once the process is gone. A kernel without
/// schedstats or task I/O accounting leaves those fields at -1.
std::optional<ProcessActivity> read_process_activity(pid_t pid);

/// Parses /proc/PID/stat's text (the command name may hold spaces and parentheses) and wchan's;
/// nullopt for text that is not a stat line.
std::optional<ProcessRunState> parse_run_state(std::string_view stat, std::string_view wchan);

/// /proc/PID's state; nullopt once the process is gone.
std::optional<ProcessRunState> read_run_state(pid_t pid);

/// Why a process cannot run, in words: stopped (T), traced (t), in uninterruptible sleep (D, with
/// the kernel function) or frozen by its cgroup; nullopt for a process that can run.
std::optional<std::string> describe_not_running(const ProcessRunState& state);

/// The process that took the most CPU, over its life, among those running now on a CPU that
/// `pid` may use, other than `pid`'s own process group: "pid 4242 (python3) at 98% of a CPU";
/// nullopt when none took a tenth of one.
std::optional<std::string> busiest_process_beside(pid_t pid);

}  // namespace mcprun
