#include "launcher/process/process_control.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/sys.hpp"
#include "common/unique_fd.hpp"

namespace mcprun {
namespace {

/// Blocks every signal for its lifetime, so no handler of the launcher runs in a forked child
/// before that child has reset its dispositions.
class SignalBlock {
 public:
  SignalBlock() {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &saved_);
  }
  ~SignalBlock() { pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }
  SignalBlock(const SignalBlock&) = delete;
  SignalBlock& operator=(const SignalBlock&) = delete;

 private:
  sigset_t saved_;
};

/// Runs in the child between fork and exec: async-signal-safe calls only.
[[noreturn]] void exec_child(const SpawnRequest& request, char* const* argv, char* const* envp,
                             pid_t launcher, int report_fd) {
  auto fail = [&](const char* call) {
    const int saved = errno;
    // One write: the parent's one read then always gets the call's name and its errno together.
    char report[64] = {};
    const size_t length = std::min(std::strlen(call), sizeof report - 1 - sizeof saved);
    std::memcpy(report, call, length);
    std::memcpy(report + length + 1, &saved, sizeof saved);
    [[maybe_unused]] auto n = ::write(report_fd, report, length + 1 + sizeof saved);
    _exit(127);
  };
  if (::setpgid(0, 0) != 0) fail("setpgid");
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail("prctl(PR_SET_PDEATHSIG)");
  if (::getppid() != launcher) _exit(127);  // The launcher died before PDEATHSIG was armed.
  for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);
  if (!request.cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : request.cpus) CPU_SET(cpu, &set);
    if (::sched_setaffinity(0, sizeof set, &set) != 0) fail("sched_setaffinity");
  }
  if (request.stdout_fd >= 0 && ::dup2(request.stdout_fd, 1) < 0) fail("dup2(stdout)");
  if (request.stderr_fd >= 0 && ::dup2(request.stderr_fd, 2) < 0) fail("dup2(stderr)");
  // Every descriptor but 0-2 and the exec report pipe (close-on-exec) is closed now.
  if (report_fd > 3) ::close_range(3, report_fd - 1, 0);
  ::close_range(report_fd + 1, ~0U, 0);
  sigset_t empty;
  sigemptyset(&empty);
  ::sigprocmask(SIG_SETMASK, &empty, nullptr);
  ::execvpe(argv[0], argv, envp);
  fail("execvp");
  _exit(127);  // Unreachable: fail() exits; tells the compiler so.
}

ProcessExit exit_from_status(pid_t pid, int status) {
  ProcessExit exit{pid, 0, 0};
  if (WIFEXITED(status)) exit.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) exit.signal = WTERMSIG(status);
  return exit;
}

}  // namespace

/// The guardian's whole life: collect process groups until the pipe closes; if the launcher did
/// not send the all-clear (pgid 0) first, it died abruptly, so kill every group it had.
[[noreturn]] void guard_groups(int read_fd) {
  // Nothing else of the launcher's: a copy of a pipe or socket here would keep it open.
  if (read_fd > 3) ::close_range(3, read_fd - 1, 0);
  ::close_range(read_fd + 1, ~0U, 0);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE}) ::signal(sig, SIG_IGN);
  std::vector<pid_t> groups;
  bool all_clear = false;
  for (pid_t pgid; !all_clear;) {
    ssize_t n = ::read(read_fd, &pgid, sizeof pgid);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof pgid)) break;
    if (pgid == 0) all_clear = true;
    else groups.push_back(pgid);
  }
  if (!all_clear)
    for (pid_t pgid : groups) ::kill(-pgid, SIGKILL);
  _exit(0);
}

PosixProcessControl::PosixProcessControl() {
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
  // Build argv/envp before forking: the child may not allocate.
  std::vector<char*> argv, envp;
  for (const auto& arg : request.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  for (const auto& entry : request.env) envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);

  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return Error{std::string("pipe2: ") + std::strerror(errno)};
  UniqueFd report_read(report[0]), report_write(report[1]);
  const pid_t launcher = ::getpid();
  pid_t pid;
  {
    SignalBlock block;
    pid = ::fork();
    if (pid == 0) exec_child(request, argv.data(), envp.data(), launcher, report_write.get());
  }
  if (pid < 0) return Error{std::string("fork: ") + std::strerror(errno)};
  // Also set from the parent, so the group exists before we ever signal it.
  ::setpgid(pid, pid);
  report_write.reset();
  char buffer[64] = {};
  ssize_t n;
  do n = ::read(report_read.get(), buffer, sizeof buffer);
  while (n < 0 && errno == EINTR);
  if (n > 0) {
    size_t name_length = ::strnlen(buffer, sizeof buffer);
    int child_errno = 0;
    if (name_length + 1 + sizeof child_errno <= static_cast<size_t>(n))
      std::memcpy(&child_errno, buffer + name_length + 1, sizeof child_errno);
    int status;
    ::waitpid(pid, &status, 0);
    return Error{std::string(buffer, name_length) + "(" + request.argv[0] +
                 "): " + std::strerror(child_errno)};
  }
  spawned_.push_back(pid);
  if (guardian_fd_ >= 0) [[maybe_unused]] auto n = ::write(guardian_fd_, &pid, sizeof pid);
  return pid;
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
    exits.push_back(exit_from_status(pid, status));
  }
  return exits;
}

std::optional<ProcessExit> PosixProcessControl::reap_one(pid_t pid) {
  // A pid still in spawned_ is unreaped, so it cannot have been reused by another process.
  if (std::find(spawned_.begin(), spawned_.end(), pid) == spawned_.end()) return std::nullopt;
  int status = 0;
  if (::waitpid(pid, &status, WNOHANG) != pid) return std::nullopt;
  std::erase(spawned_, pid);
  return exit_from_status(pid, status);
}

bool PosixProcessControl::has_children() {
  siginfo_t info{};
  return ::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0;
}

}  // namespace mcprun
