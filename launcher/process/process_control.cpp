#include "launcher/process/process_control.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/sys.hpp"
#include "launcher/process/boost_process.hpp"

namespace mcprun {
namespace {

namespace v2 = boost::process::v2;
using Launcher = v2::posix::default_launcher;
using std::filesystem::path;
using v2::error_code;

/// How a step between fork and exec fails: v2 sends errno to the parent and ends the child.
error_code last_error() { return {errno, boost::system::system_category()}; }

// Each concern of a worker's start is one v2 initializer. v2 calls on_setup in the launcher before
// fork, on_exec_setup in the child before exec (async-signal-safe calls only: everything is
// prepared in the constructors), on_success and on_error in the launcher afterwards.

/// The worker leads a process group of its own, so a signal to the group reaches what it starts.
/// v2 returns only after the exec, so the group exists before the launcher can signal it.
struct OwnProcessGroup {
  error_code on_exec_setup(Launcher&, const path&, const char* const*) {
    return ::setpgid(0, 0) == 0 ? error_code{} : last_error();
  }
};

/// The worker dies with the launcher: PR_SET_PDEATHSIG for itself, the guardian for its group.
class DiesWithTheLauncher {
 public:
  explicit DiesWithTheLauncher(int guardian_fd)
      : launcher_(::getpid()), guardian_fd_(guardian_fd) {}
  error_code on_exec_setup(Launcher&, const path&, const char* const*) {
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) return last_error();
    if (::getppid() != launcher_) _exit(127);  // The launcher died before PDEATHSIG was armed.
    return {};
  }
  void on_success(Launcher& launcher, const path&, const char* const*) {
    if (guardian_fd_ >= 0) [[maybe_unused]]
      auto n = ::write(guardian_fd_, &launcher.pid, sizeof(pid_t));
  }

 private:
  pid_t launcher_;
  int guardian_fd_;
};

/// The worker starts with default dispositions and an empty mask. Every signal stays blocked in
/// the launcher from before fork until the launch returns, so no handler of the launcher ever
/// runs in the child before its dispositions are reset.
class DefaultSignals {
 public:
  DefaultSignals() = default;
  DefaultSignals(const DefaultSignals&) = delete;
  DefaultSignals& operator=(const DefaultSignals&) = delete;
  ~DefaultSignals() {
    if (blocked_) ::pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
  }
  error_code on_setup(Launcher&, const path&, const char* const*) {
    sigset_t all;
    sigfillset(&all);
    blocked_ = ::pthread_sigmask(SIG_SETMASK, &all, &saved_) == 0;
    return {};
  }
  error_code on_exec_setup(Launcher&, const path&, const char* const*) {
    for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);
    sigset_t empty;
    sigemptyset(&empty);
    ::sigprocmask(SIG_SETMASK, &empty, nullptr);
    return {};
  }

 private:
  sigset_t saved_;
  bool blocked_ = false;
};

/// The CPUs of --numa-binding (or none: the worker inherits the launcher's).
class CpuAffinity {
 public:
  explicit CpuAffinity(const std::vector<int>& cpus) : bind_(!cpus.empty()) {
    CPU_ZERO(&set_);
    for (int cpu : cpus) CPU_SET(cpu, &set_);
  }
  error_code on_exec_setup(Launcher&, const path&, const char* const*) {
    if (bind_ && ::sched_setaffinity(0, sizeof set_, &set_) != 0) return last_error();
    return {};
  }

 private:
  cpu_set_t set_;
  bool bind_;
};

/// Closes every descriptor between stderr and v2's exec-error pipe. v2 closes the rest, but
/// 1.81's close_all compares each whitelisted descriptor with itself instead of the next one, so
/// it skips the gaps between them: 3 up to the pipe would reach the worker. Runs after the
/// stdio initializer, which dup2s from descriptors in that range.
struct CloseInheritedDescriptors {
  error_code on_exec_setup(Launcher& launcher, const path&, const char* const*) {
    const int exec_error_pipe =
        *std::max_element(launcher.fd_whitelist.begin(), launcher.fd_whitelist.end());
    if (exec_error_pipe > 3) ::close_range(3, exec_error_pipe - 1, 0);
    return {};
  }
};

/// A start that failed: the child ends without running the launcher's exit handlers, and the
/// launcher reaps it, which v2 leaves undone. 1.81 looks these hooks up with five arguments and
/// calls them with four: one variadic form answers both.
struct FailedStart {
  template <typename... Ignored>
  void on_exec_error(Launcher&, Ignored&&...) {
    _exit(127);  // v2 would exit(), flushing the launcher's stdio buffers a second time.
  }
  template <typename... Ignored>
  void on_error(Launcher& launcher, Ignored&&...) {
    int status;
    if (launcher.pid > 0) ::waitpid(launcher.pid, &status, 0);
  }
};

}  // namespace

ProcessExit exit_from_wait_status(pid_t pid, int status) {
  ProcessExit exit{pid, 0, 0};
  if (WIFEXITED(status))
    exit.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status))
    exit.signal = WTERMSIG(status);
  return exit;
}

/// The guardian's whole life: collect process groups until the pipe closes; if the launcher did
/// not send the all-clear (pgid 0) first, it died abruptly, so kill every group it had.
[[noreturn]] void guard_groups(int read_fd) {
  // Nothing else of the launcher's: a copy of a pipe or socket here would keep it open.
  if (read_fd > 3) ::close_range(3, read_fd - 1, 0);
  ::close_range(read_fd + 1, ~0U, 0);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE})
    ::signal(sig, SIG_IGN);
  std::vector<pid_t> groups;
  bool all_clear = false;
  for (pid_t pgid; !all_clear;) {
    ssize_t n = ::read(read_fd, &pgid, sizeof pgid);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof pgid)) break;
    if (pgid == 0)
      all_clear = true;
    else
      groups.push_back(pgid);
  }
  if (!all_clear)
    for (pid_t pgid : groups) ::kill(-pgid, SIGKILL);
  _exit(0);
}

PosixProcessControl::PosixProcessControl()
    : launch_context_(std::make_unique<boost::asio::io_context>()) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) == 0) {
    // Double fork: the guardian must not be our child, or it would count as a live worker. A
    // subreaper (a second instance in one process) would adopt it back, so not while forking.
    ::prctl(PR_SET_CHILD_SUBREAPER, 0);
    pid_t middle = ::fork();
    if (middle == 0) {
      ::close(fds[1]);
      ::setsid();  // Out of the terminal's process group: a Ctrl-C is for the launcher.
      if (::fork() == 0) guard_groups(fds[0]);
      _exit(0);
    }
    ::close(fds[0]);
    if (middle > 0) {
      int status;
      ::waitpid(middle, &status, 0);
      guardian_fd_ = fds[1];
    } else {
      ::close(fds[1]);
    }
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
}

PosixProcessControl::~PosixProcessControl() {
  if (guardian_fd_ < 0) return;
  const pid_t all_clear = 0;
  [[maybe_unused]] auto n = ::write(guardian_fd_, &all_clear, sizeof all_clear);
  ::close(guardian_fd_);
}

Expected<pid_t> PosixProcessControl::spawn(const SpawnRequest& request) {
  if (request.argv.empty()) return Error{"nothing to start: an empty command line"};
  // execvp's search, done before fork: the launcher's PATH, and a name with a slash as it is.
  const char* search_path = std::getenv("PATH");
  auto executable = find_executable(request.argv[0], search_path ? search_path : "");
  if (!executable) return Error{"execvp(" + request.argv[0] + "): " + std::strerror(ENOENT)};

  // argv keeps the name the user gave as argv[0]; v2 passes a plain array through unchanged.
  std::vector<const char*> argv, envp;
  for (const auto& arg : request.argv) argv.push_back(arg.c_str());
  argv.push_back(nullptr);
  for (const auto& entry : request.env) envp.push_back(entry.c_str());
  envp.push_back(nullptr);

  Launcher launcher;
  launcher.env = envp.data();
  v2::process_stdio stdio;
  if (request.stdout_fd >= 0) stdio.out = request.stdout_fd;
  if (request.stderr_fd >= 0) stdio.err = request.stderr_fd;
  DefaultSignals signals;
  error_code ec;
  // The order is the order of the steps in the child: the descriptors last, after stdio's dup2.
  ChildProcess started =
      launcher(launch_context_->get_executor(), ec, path(*executable), argv.data(), signals,
               OwnProcessGroup{}, DiesWithTheLauncher(guardian_fd_), CpuAffinity(request.cpus),
               stdio, CloseInheritedDescriptors{}, FailedStart{});
  if (ec) return Error{"execvp(" + request.argv[0] + "): " + ec.message()};
  // The launcher reaps through reap() and reap_one(); a basic_process would SIGKILL it when gone.
  started.detach();
  spawned_.push_back(launcher.pid);
  return launcher.pid;
}

void PosixProcessControl::signal_group(pid_t pgid, int signal) { ::kill(-pgid, signal); }

void PosixProcessControl::signal_process(pid_t pid, int signal) { ::kill(pid, signal); }

void PosixProcessControl::signal_orphans(int signal) {
  // Adopted orphans are our children but not ones we spawned; the kernel lists them per task.
  const pid_t self = ::getpid();
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream children(task.path() / "children");
    for (pid_t child; children >> child;) {
      if (std::find(spawned_.begin(), spawned_.end(), child) != spawned_.end()) continue;
      if (child != self) {
        ::kill(-child, signal);  // It may lead a group of its own (setsid'ed daemons do).
        ::kill(child, signal);
      }
    }
  }
}

std::vector<ProcessExit> PosixProcessControl::reap() {
  std::vector<ProcessExit> exits;
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    std::erase(spawned_, pid);
    exits.push_back(exit_from_wait_status(pid, status));
  }
  return exits;
}

std::optional<ProcessExit> PosixProcessControl::reap_one(pid_t pid) {
  // A pid still in spawned_ is unreaped, so it cannot have been reused by another process.
  if (std::find(spawned_.begin(), spawned_.end(), pid) == spawned_.end()) return std::nullopt;
  int status = 0;
  const pid_t reaped = ::waitpid(pid, &status, WNOHANG);
  if (reaped < 0 && errno == ECHILD) std::erase(spawned_, pid);  // A v2 wait took it.
  if (reaped != pid) return std::nullopt;
  std::erase(spawned_, pid);
  return exit_from_wait_status(pid, status);
}

bool PosixProcessControl::has_children() {
  siginfo_t info{};
  return ::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0;
}

}  // namespace mcprun
