#include "launcher/process/deadline.hpp"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include "common/unique_fd.hpp"

namespace mcprun {
namespace {

using namespace std::chrono_literals;

std::vector<std::string> shell(const std::string& script) { return {"/bin/sh", "-c", script}; }

TEST(RunWithDeadline, CapturesStdoutAndTheExit) {
  PosixProcessControl control;
  auto run = run_with_deadline(control, shell("echo answer; echo noise >&2; exit 3"),
                               {"PATH=/usr/bin:/bin"}, 10s, 5s);
  ASSERT_TRUE(run) << run.error().message;
  EXPECT_EQ(run->output, "answer\n");  // stderr is discarded.
  EXPECT_FALSE(run->timed_out);
  ASSERT_TRUE(run->exit);
  EXPECT_EQ(run->exit->exit_code, 3);
}

TEST(RunWithDeadline, KillsARunThatIsStillWritingAtTheDeadline) {
  PosixProcessControl control;
  const auto start = std::chrono::steady_clock::now();
  auto run = run_with_deadline(control, shell("echo started; exec sleep 30"),
                               {"PATH=/usr/bin:/bin"}, 300ms, 5s);
  ASSERT_TRUE(run);
  EXPECT_TRUE(run->timed_out);
  EXPECT_EQ(run->output, "started\n");
  ASSERT_TRUE(run->exit);
  EXPECT_EQ(run->exit->signal, SIGKILL);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(RunWithDeadline, KillsARunThatLingersAfterClosingStdout) {
  PosixProcessControl control;
  auto run = run_with_deadline(control, shell("echo done; exec >&-; exec sleep 30"),
                               {"PATH=/usr/bin:/bin"}, 10s, 200ms);
  ASSERT_TRUE(run);
  EXPECT_FALSE(run->timed_out);
  EXPECT_EQ(run->output, "done\n");
  ASSERT_TRUE(run->exit);
  EXPECT_EQ(run->exit->signal, SIGKILL);
}

TEST(RunWithDeadline, ACommandThatCannotStartIsAnError) {
  PosixProcessControl control;
  auto run = run_with_deadline(control, {"/nonexistent/python3"}, {}, 1s, 1s);
  ASSERT_FALSE(run);
  EXPECT_NE(run.error().message.find("No such file"), std::string::npos) << run.error().message;
}

TEST(WaitForFd, ReturnsOnReadinessOrAfterTheLimit) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(wait_for_fd(read_end.get(), POLLIN, 100ms));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
  ASSERT_EQ(::write(write_end.get(), "x", 1), 1);
  EXPECT_TRUE(wait_for_fd(read_end.get(), POLLIN, 0ms));
  EXPECT_TRUE(wait_for_fd(write_end.get(), POLLOUT, 0ms));
}

TEST(OpenPidfd, NamesAPidThatIsGone) {
  auto pidfd = open_pidfd(999999999);
  ASSERT_FALSE(pidfd);
  EXPECT_EQ(pidfd.error().message.rfind("pidfd_open(999999999): ", 0), 0u) << pidfd.error().message;
}

}  // namespace
}  // namespace mcprun
