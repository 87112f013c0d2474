#include "launcher/process/deadline.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
extern "C" {  // glibc 2.36 declares these without C linkage.
#include <sys/pidfd.h>
}
#include <unistd.h>

#include <algorithm>
#include <boost/asio/connect_pipe.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/readable_pipe.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/writable_pipe.hpp>
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
  if (!fd.valid()) return Error{"pidfd_open(" + std::to_string(pid) + "): " + std::strerror(errno)};
  return fd;
}

Expected<ChildProcess> watch_child(boost::asio::io_context& io, pid_t pid) {
  // Opened here rather than by v2, which would not report a failure.
  auto pidfd = open_pidfd(pid);
  if (!pidfd) return pidfd.error();
  return ChildProcess(io.get_executor(), pid, pidfd->release());
}

std::optional<ProcessExit> exit_of(ProcessControl& control, ChildProcess& child,
                                   boost::system::error_code ec) {
  // Finds the child gone when v2 reaped it, and forgets it; reaps it when v2 did not get to.
  auto reaped = control.reap_one(child.id());
  if (ec) return reaped;
  return exit_from_wait_status(child.id(), child.native_exit_code());
}

void kill_and_wait(ProcessControl& control, pid_t pid) {
  // A pidfd of its own: 1.81's basic_process::native_handle() does not compile.
  auto pidfd = open_pidfd(pid);
  if (!pidfd) return;  // Gone already.
  control.signal_group(pid, SIGKILL);
  wait_for_fd(pidfd->get(), POLLIN, kKilledExitTimeout);
}

Expected<BoundedRun> run_with_deadline(ProcessControl& control, std::vector<std::string> argv,
                                       std::vector<std::string> env,
                                       std::chrono::milliseconds timeout,
                                       std::chrono::milliseconds exit_timeout) {
  boost::asio::io_context io;
  boost::asio::readable_pipe output(io);
  boost::asio::writable_pipe child_end(io);
  boost::system::error_code ec;
  boost::asio::connect_pipe(output, child_end, ec);
  if (ec) return Error{"pipe: " + ec.message()};
  UniqueFd discard(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  auto pid = control.spawn(
      {std::move(argv), std::move(env), {}, child_end.native_handle(), discard.get()});
  child_end.close(ec);  // Ours closed, the child's end is the only one: its exit ends our reads.
  if (!pid) return pid.error();
  auto child = watch_child(io, *pid);
  if (!child) {  // Without it the run cannot be bounded: end it now rather than wait unbounded.
    control.signal_group(*pid, SIGKILL);
    return child.error();
  }

  BoundedRun run;
  boost::asio::steady_timer deadline(io, timeout);
  bool killed = false, exited = false;
  auto on_deadline = [&](auto& self, boost::system::error_code waited) -> void {
    if (waited) return;
    if (killed) return io.stop();  // It outlived its SIGKILL: no longer waiting for it.
    if (output.is_open()) run.timed_out = true;
    output.close(ec);
    killed = true;
    control.signal_group(*pid, SIGKILL);
    deadline.expires_after(kKilledExitTimeout);
    deadline.async_wait([&](boost::system::error_code next) { self(self, next); });
  };
  deadline.async_wait([&](boost::system::error_code waited) { on_deadline(on_deadline, waited); });
  // A process exits right after closing its stdout; one that lingers is killed.
  boost::asio::async_read(
      output, boost::asio::dynamic_buffer(run.output), [&](boost::system::error_code, size_t) {
        if (run.timed_out || exited) return;
        output.close(ec);
        deadline.expires_after(exit_timeout);
        deadline.async_wait(
            [&](boost::system::error_code waited) { on_deadline(on_deadline, waited); });
      });
  child->async_wait([&](boost::system::error_code waited, int) {
    exited = true;
    run.exit = exit_of(control, *child, waited);
    deadline.cancel();
  });
  io.run();
  child->detach();
  return run;
}

}  // namespace mcprun
