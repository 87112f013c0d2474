// The OS seam: starting, signalling and reaping worker processes. Supervision logic talks only to
// this interface, so its policy can run against a fake; PosixProcessControl is the real one.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/expected.hpp"

namespace boost::asio {
class io_context;
}

namespace mcprun {

/// What to start: argv is exec'ed directly, never through a shell.
struct SpawnRequest {
  std::vector<std::string> argv;
  std::vector<std::string> env;  ///< Complete environment, "KEY=VALUE".
  std::vector<int> cpus;         ///< Affinity set before exec; empty: inherit.
  int stdout_fd = -1;            ///< Becomes the child's fd 1 (-1: inherit).
  int stderr_fd = -1;            ///< Becomes the child's fd 2 (-1: inherit).
};

/// How a reaped process ended.
struct ProcessExit {
  pid_t pid = 0;
  int exit_code = 0;  ///< Valid when signal == 0.
  int signal = 0;     ///< Signal that killed it, or 0.
  bool succeeded() const { return signal == 0 && exit_code == 0; }
};

/// The ProcessExit of a status from waitpid (or from Boost.Process, which passes it on as is).
ProcessExit exit_from_wait_status(pid_t pid, int status);

/// Starts and controls worker processes.
class ProcessControl {
 public:
  virtual ~ProcessControl() = default;
  /// Starts a worker as the leader of a new process group. Returns its pid, or an error naming
  /// the failing call (exec errors included).
  virtual Expected<pid_t> spawn(const SpawnRequest& request) = 0;
  /// Sends `signal` to the whole process group led by `pgid`.
  virtual void signal_group(pid_t pgid, int signal) = 0;
  /// Sends `signal` to the process `pid` alone, not its group: faulthandler's SIGABRT is for the
  /// worker, not for whatever it started.
  virtual void signal_process(pid_t pid, int signal) = 0;
  /// Sends `signal` to processes that were orphaned and re-parented to the launcher.
  virtual void signal_orphans(int signal) = 0;
  /// Reaps every child that has exited, without blocking.
  virtual std::vector<ProcessExit> reap() = 0;
  /// Reaps `pid` alone if it has exited, without blocking, for a caller that learned of the exit
  /// itself (a pidfd). nullopt while it runs, or once reap() or a Boost.Process wait has taken it.
  virtual std::optional<ProcessExit> reap_one(pid_t pid) = 0;
  /// Whether any child (worker or adopted orphan) is still unreaped.
  virtual bool has_children() = 0;
  /// For a control whose processes end without a SIGCHLD (a test's fake): `listener` runs after
  /// each such ending, so that the event loop reaps it. The real one never calls it: the kernel's
  /// SIGCHLD wakes the loop. An empty function removes the listener.
  virtual void set_exit_listener(std::function<void()> listener) { (void)listener; }
};

/// Starts through Boost.Process v2's launcher, one initializer per concern: own process group,
/// default signal dispositions and an empty mask, the CPU set, stdout and stderr, no inherited fds
/// beyond 0-2, PR_SET_PDEATHSIG and the guardian so a SIGKILLed launcher takes its workers along.
class PosixProcessControl final : public ProcessControl {
 public:
  /// Starts the group guardian, then makes the launcher a child subreaper, so that orphaned
  /// grandchildren come back to it.
  PosixProcessControl();
  /// Tells the guardian the launcher ended cleanly, so it kills nothing.
  ~PosixProcessControl() override;
  PosixProcessControl(const PosixProcessControl&) = delete;
  PosixProcessControl& operator=(const PosixProcessControl&) = delete;
  Expected<pid_t> spawn(const SpawnRequest& request) override;
  void signal_group(pid_t pgid, int signal) override;
  void signal_process(pid_t pid, int signal) override;
  void signal_orphans(int signal) override;
  std::vector<ProcessExit> reap() override;
  std::optional<ProcessExit> reap_one(pid_t pid) override;
  bool has_children() override;

 private:
  std::vector<pid_t> spawned_;  ///< Group leaders we started; others we reap are orphans.
  /// What v2's launcher needs for its fork notifications: a context of its own, so the event
  /// loop's descriptors are not registered again in every child.
  std::unique_ptr<boost::asio::io_context> launch_context_;
  /// Write end of the pipe to the guardian: a process outside our tree that learns each worker's
  /// process group and SIGKILLs them all if the launcher dies without saying goodbye. PDEATHSIG
  /// alone reaches only the workers themselves, not what they started.
  int guardian_fd_ = -1;
};

}  // namespace mcprun
