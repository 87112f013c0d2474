// Bounding a child in time: the policy mcprun puts over Boost.Process v2, which awaits a child
// through its pidfd (Linux >= 5.3) on an Asio loop, so an exit is learned without SIGCHLD or
// polling. The stack dumpers use watch_child on the event loop; run_with_deadline is the blocking
// whole, for the doctor's probes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/expected.hpp"
#include "common/unique_fd.hpp"
#include "launcher/process/boost_process.hpp"
#include "launcher/process/process_control.hpp"

namespace mcprun {

/// How long a SIGKILLed process may take to exit before mcprun stops waiting for it (whoever
/// reaps children collects it later): the kernel needs milliseconds, a loaded box a little more.
inline constexpr std::chrono::seconds kKilledExitTimeout{1};

/// Waits until `fd` reports one of `events` (POLLIN, POLLOUT) or `limit` passes; a signal does
/// not cut the wait short. False on timeout or a poll error.
bool wait_for_fd(int fd, short events, std::chrono::milliseconds limit);

/// A pidfd of `pid`: readable once it exits. The error names the pid and the call's errno.
Expected<UniqueFd> open_pidfd(pid_t pid);

/// `pid`, a child started through a ProcessControl, as a v2 process on `io`: async_wait reaps it.
/// Call detach() before it goes: v2 would SIGKILL a running child and wait for it unbounded.
Expected<ChildProcess> watch_child(boost::asio::io_context& io, pid_t pid);

/// How a watched child ended, from its async_wait: nullopt when reap() took the status first.
/// The control is told, so that it no longer counts the child as its own.
std::optional<ProcessExit> exit_of(ProcessControl& control, ChildProcess& child,
                                   boost::system::error_code ec);

/// SIGKILLs the process group of `pid`, an unreaped child, and waits up to kKilledExitTimeout
/// for it to exit.
void kill_and_wait(ProcessControl& control, pid_t pid);

/// What a run bounded by run_with_deadline printed and how it ended.
struct BoundedRun {
  std::string output;               ///< Its stdout, as far as it got.
  bool timed_out = false;           ///< Still writing at the deadline: killed.
  std::optional<ProcessExit> exit;  ///< nullopt: it outlived its SIGKILL (or was reaped elsewhere).
};

/// Runs `argv` under `env` (a complete environment) through `control`, its stdout captured and its
/// stderr discarded. Its process group is SIGKILLed when its stdout is still open at `timeout`,
/// or when it lingers more than `exit_timeout` after closing it. Fails only when it cannot start.
Expected<BoundedRun> run_with_deadline(ProcessControl& control, std::vector<std::string> argv,
                                       std::vector<std::string> env,
                                       std::chrono::milliseconds timeout,
                                       std::chrono::milliseconds exit_timeout);

}  // namespace mcprun
