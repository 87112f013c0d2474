#include "launcher/process/process_control.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <string>

#include "common/unique_fd.hpp"
#include "launcher/process/deadline.hpp"

namespace mcprun {
namespace {

using namespace std::chrono_literals;

/// What `script` (run by /bin/sh through `control`) printed, and how it ended.
BoundedRun run_shell(ProcessControl& control, const std::string& script) {
  auto run = run_with_deadline(control, {"sh", "-c", script}, {"PATH=/usr/bin:/bin"}, 10s, 5s);
  EXPECT_TRUE(run) << run.error().message;
  return run ? *run : BoundedRun{};
}

TEST(PosixProcessControl, AChildInheritsNoDescriptorBeyondItsStdio) {
  PosixProcessControl control;
  // Without close-on-exec, below the launch's own pipes: exactly what must not reach the child.
  UniqueFd inheritable(::open("/dev/null", O_RDONLY));
  ASSERT_GE(inheritable.get(), 3);
  auto run = run_shell(control, "exec ls /proc/self/fd");
  EXPECT_EQ(run.output, "0\n1\n2\n3\n");  // 3: the directory ls is listing.
}

TEST(PosixProcessControl, AChildLeadsItsOwnGroupWithDefaultSignals) {
  PosixProcessControl control;
  ::signal(SIGUSR1, SIG_IGN);  // The launcher's dispositions and mask are not the child's.
  sigset_t usr2, saved;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  ::pthread_sigmask(SIG_BLOCK, &usr2, &saved);
  auto run = run_shell(control,
                       "cut -d' ' -f5 /proc/$$/stat; echo $$; "
                       "grep -E '^Sig(Blk|Ign)' /proc/$$/status | cut -f2");
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  ::signal(SIGUSR1, SIG_DFL);
  std::istringstream lines(run.output);
  std::string pgid, pid, blocked, ignored;
  lines >> pgid >> pid >> blocked >> ignored;
  EXPECT_EQ(pgid, pid);
  EXPECT_EQ(blocked, "0000000000000000");
  EXPECT_EQ(ignored, "0000000000000000");
}

TEST(PosixProcessControl, AChildRunsOnItsCpusWithItsOwnArgv0AndEnvironment) {
  PosixProcessControl control;
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  // A bare name is searched on the launcher's PATH, and stays the child's argv[0].
  auto pid = control.spawn(
      {{"sh", "-c", "echo \"$0 $ONLY\"; grep Cpus_allowed_list /proc/$$/status | cut -f2"},
       {"ONLY=this"},
       {0},
       write_end.get(),
       -1});
  ASSERT_TRUE(pid) << pid.error().message;
  write_end.reset();
  std::string output;
  char chunk[256];
  for (ssize_t n; (n = ::read(read_end.get(), chunk, sizeof chunk)) > 0;) output.append(chunk, n);
  int status;
  ASSERT_EQ(::waitpid(*pid, &status, 0), *pid);
  EXPECT_EQ(output, "sh this\n0\n");
}

TEST(PosixProcessControl, AStartThatFailsNamesTheProgramAndLeavesNoChild) {
  PosixProcessControl control;
  auto missing = control.spawn({{"no-such-program-anywhere"}, {}, {}, -1, -1});
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().message, "execvp(no-such-program-anywhere): No such file or directory");
  // Found, but exec refuses it: the child that failed is reaped, not left a zombie.
  auto refused = control.spawn({{"/dev/null"}, {}, {}, -1, -1});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().message, "execvp(/dev/null): Permission denied");
  EXPECT_FALSE(control.has_children());
}

}  // namespace
}  // namespace mcprun
