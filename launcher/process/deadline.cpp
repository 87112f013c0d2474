#include "launcher/process/deadline.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
extern "C" {  // glibc 2.36 declares these without C linkage.
#include <sys/pidfd.h>
}
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mcprun {

bool wait_for_fd(int fd, short events, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  pollfd waiting{fd, events, 0};
  for (;;) {
    // Rounded up: a wait never ends before `limit`, only at poll's millisecond after it.
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const int ready = ::poll(&waiting, 1, static_cast<int>(std::max<long>(0, left.count())));
    if (ready > 0) return true;
    if (ready == 0 || errno != EINTR) return false;
  }
}

Expected<UniqueFd> open_pidfd(pid_t pid) {
  UniqueFd fd(::pidfd_open(pid, 0));
  if (!fd.valid())
    return Error{"pidfd_open(" + std::to_string(pid) + "): " + std::strerror(errno)};
  return fd;
}

void kill_and_wait(ProcessControl& control, pid_t pid, int pidfd) {
  control.signal_group(pid, SIGKILL);
  wait_for_fd(pidfd, POLLIN, kKilledExitTimeout);
}

Expected<BoundedRun> run_with_deadline(ProcessControl& control, std::vector<std::string> argv,
                                       std::vector<std::string> env,
                                       std::chrono::milliseconds timeout,
                                       std::chrono::milliseconds exit_timeout) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return Error{std::string("pipe2: ") + std::strerror(errno)};
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  UniqueFd discard(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  auto pid = control.spawn({std::move(argv), std::move(env), {}, write_end.get(), discard.get()});
  write_end.reset();  // Ours closed, the child's end is the only one: its exit ends our reads.
  if (!pid) return pid.error();
  auto pidfd = open_pidfd(*pid);
  if (!pidfd) {  // Without it the run cannot be bounded: end it now rather than wait unbounded.
    control.signal_group(*pid, SIGKILL);
    return pidfd.error();
  }

  BoundedRun run;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (char chunk[4096];;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || !wait_for_fd(read_end.get(), POLLIN, left)) {
      run.timed_out = true;
      break;
    }
    const ssize_t n = ::read(read_end.get(), chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    run.output.append(chunk, static_cast<size_t>(n));
  }
  // A process exits right after closing its stdout; one that timed out or lingers is killed.
  if (run.timed_out || !wait_for_fd(pidfd->get(), POLLIN, exit_timeout))
    kill_and_wait(control, *pid, pidfd->get());
  run.exit = control.reap_one(*pid);
  return run;
}

}  // namespace mcprun
