#include "launcher/watch/stack_dump.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
extern "C" {  // glibc 2.36 declares these without C linkage.
#include <sys/pidfd.h>
}
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/signal_set.hpp>
#include <cerrno>
#include <fstream>
#include <regex>
#include <sstream>

#include "common/event_loop.hpp"
#include "common/unique_fd.hpp"

namespace mcprun {
namespace {

/// How long any one test may wait for its dumps or its processes.
constexpr std::chrono::seconds kTestDeadline{30};
/// How often a condition that no handler reports (a process's state) is checked.
constexpr std::chrono::milliseconds kPollSlice{10};

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// The scheduler state letter from /proc/PID/stat: 'S' sleeping, 'T' stopped, 't' traced.
char process_state(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ? '?' : stat[paren + 2];
}

/// Stopped by a signal ('T') or at a tracer's stop ('t'): what a dump must never leave behind.
bool stopped(pid_t pid) {
  const char state = process_state(pid);
  return state == 'T' || state == 't';
}

std::string tracer_pid(pid_t pid) {
  std::smatch match;
  const std::string status = read_file("/proc/" + std::to_string(pid) + "/status");
  return std::regex_search(status, match, std::regex("TracerPid:\\s*(\\d+)")) ? match[1].str()
                                                                              : "?";
}

/// Waits, bounded, for `fd` to be readable; SIGCHLD (a test's reaper) does not cut it short.
bool wait_readable(int fd) {
  pollfd ready{fd, POLLIN, 0};
  int n;
  do n = ::poll(&ready, 1, std::chrono::milliseconds(kTestDeadline).count());
  while (n < 0 && errno == EINTR);
  return n == 1;
}

/// Runs `io` in short slices until `done()`, for a condition that no handler reports.
bool poll_until(boost::asio::io_context& io, const std::function<bool()>& done,
                std::chrono::steady_clock::duration limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done() && std::chrono::steady_clock::now() < deadline)
    run_until(
        io, [] { return false; }, kPollSlice);
  return done();
}

/// Per-test scratch folder, removed afterwards.
class StackDumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("stack_dump_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    for (pid_t pid : targets_) {
      control_.signal_group(pid, SIGKILL);
      wait_for_exit(pid);
    }
    std::filesystem::remove_all(dir_);
  }

  /// A python3 that is asleep in time.sleep() once this returns.
  pid_t start_sleeper() {
    int fds[2];
    EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    UniqueFd read_end(fds[0]), write_end(fds[1]);
    auto pid = control_.spawn(
        {{"/usr/bin/python3", "-c", "import time; print('ready', flush=True); time.sleep(60)"},
         {"PATH=/usr/bin:/bin"},
         {},
         write_end.get(),
         -1});
    EXPECT_TRUE(pid) << pid.error().message;
    if (!pid) return 0;
    targets_.push_back(*pid);
    write_end.reset();
    EXPECT_TRUE(wait_readable(read_end.get()));
    char line[16] = {};
    ssize_t n;
    do n = ::read(read_end.get(), line, sizeof line - 1);
    while (n < 0 && errno == EINTR);
    EXPECT_GT(n, 0);
    EXPECT_STREQ(line, "ready\n");
    return *pid;
  }

  /// Waits, bounded, for `pid` to exit and reaps it.
  void wait_for_exit(pid_t pid) {
    UniqueFd pidfd(::pidfd_open(pid, 0));
    if (pidfd.valid()) wait_readable(pidfd.get());
    control_.reap_one(pid);
  }

  /// A stand-in dumper: a shell script run as "py-spy dump --native --pid PID".
  StackDumpTool fake_py_spy(const std::string& script) {
    const auto program = dir_ / "py-spy";
    std::ofstream(program) << "#!/bin/sh\n" << script << "\n";
    std::filesystem::permissions(program, std::filesystem::perms::owner_all);
    return {StackDumpTool::Kind::kPySpy, program};
  }

  /// Runs one batch to completion; false if `done` did not run within the deadline.
  bool dump(StackDumper& dumper, std::vector<StackDumpRequest> requests,
            std::chrono::milliseconds timeout) {
    bool done = false;
    dumper.dump_all(std::move(requests), timeout, [&] { done = true; });
    return run_until(
        io_, [&] { return done; }, kTestDeadline);
  }

  boost::asio::io_context io_;
  /// Keeps io_ from stopping when a run_until() slice ends with nothing else pending.
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{
      io_.get_executor()};
  PosixProcessControl control_;
  std::filesystem::path dir_;
  std::vector<pid_t> targets_;
};

TEST_F(StackDumpTest, FindsPySpyBeforeGdbAndSkipsNonExecutables) {
  const auto bin = dir_ / "bin", other = dir_ / "other";
  std::filesystem::create_directories(bin);
  std::filesystem::create_directories(other);
  std::ofstream(bin / "gdb") << "#!/bin/sh\n";
  std::ofstream(other / "py-spy") << "#!/bin/sh\n";
  std::filesystem::permissions(bin / "gdb", std::filesystem::perms::owner_all);
  const std::string path = bin.string() + "::" + other.string();

  EXPECT_EQ(StackDumpTool::find(path).kind, StackDumpTool::Kind::kGdb);  // py-spy not executable.
  std::filesystem::permissions(other / "py-spy", std::filesystem::perms::owner_all);
  StackDumpTool tool = StackDumpTool::find(path);
  EXPECT_EQ(tool.name(), "py-spy");
  EXPECT_EQ(tool.program, other / "py-spy");
  EXPECT_EQ(tool.argv(42),
            (std::vector<std::string>{tool.program, "dump", "--native", "--pid", "42"}));
  EXPECT_EQ(StackDumpTool::find("").name(), "none");
  EXPECT_TRUE(StackDumpTool{}.argv(42).empty());
}

TEST_F(StackDumpTest, GdbDumpsEveryTargetAtOnce) {
  if (::access("/usr/bin/gdb", X_OK) != 0) GTEST_SKIP() << "needs /usr/bin/gdb";
  StackDumper dumper(io_, control_, {StackDumpTool::Kind::kGdb, "/usr/bin/gdb"});
  const pid_t first = start_sleeper(), second = start_sleeper();
  ASSERT_TRUE(dump(dumper, {{first, dir_ / "first.txt"}, {second, dir_ / "second.txt"}},
                   kStackDumpTimeout));
  for (auto [pid, file] : {std::pair{first, "first.txt"}, std::pair{second, "second.txt"}}) {
    const std::string text = read_file(dir_ / file);
    EXPECT_EQ(text.rfind("# mcprun stack dump of pid " + std::to_string(pid) + " by gdb at ", 0),
              0u)
        << text;
    EXPECT_TRUE(std::regex_search(text, std::regex("nanosleep|select|time_sleep"))) << text;
    EXPECT_EQ(text.find("killed it"), std::string::npos) << text;
    EXPECT_FALSE(stopped(pid)) << process_state(pid);
    EXPECT_EQ(tracer_pid(pid), "0");
  }
}

TEST_F(StackDumpTest, GdbPastItsTimeoutIsKilledAndTheTargetKeepsRunning) {
  if (::access("/usr/bin/gdb", X_OK) != 0) GTEST_SKIP() << "needs /usr/bin/gdb";
  StackDumper dumper(io_, control_, {StackDumpTool::Kind::kGdb, "/usr/bin/gdb"});
  const pid_t target = start_sleeper();
  // Far shorter than gdb needs to attach and walk the stack: it dies mid-dump.
  ASSERT_TRUE(dump(dumper, {{target, dir_ / "dump.txt"}}, std::chrono::milliseconds(50)));
  const std::string text = read_file(dir_ / "dump.txt");
  EXPECT_NE(text.find("# mcprun: gdb did not finish within 50 ms; killed it"), std::string::npos)
      << text;
  EXPECT_FALSE(stopped(target)) << process_state(target);
  EXPECT_EQ(tracer_pid(target), "0");
}

TEST_F(StackDumpTest, DumperThatStopsItsTargetIsKilledAndTheTargetResumed) {
  // Stops the target like an attaching tracer would, then hangs; the child sleep shares its
  // process group, so it must die too.
  StackDumper dumper(
      io_, control_,
      fake_py_spy("echo \"fake dumper $$\"\nkill -STOP \"$4\"\nsleep 60\necho late"));
  const pid_t target = start_sleeper();
  ASSERT_TRUE(dump(dumper, {{target, dir_ / "dump.txt"}}, std::chrono::milliseconds(300)));
  const std::string text = read_file(dir_ / "dump.txt");
  EXPECT_NE(text.find("# mcprun: py-spy did not finish within 300 ms; killed it"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("late"), std::string::npos) << text;
  EXPECT_FALSE(stopped(target)) << process_state(target);
  std::smatch match;
  ASSERT_TRUE(std::regex_search(text, match, std::regex("fake dumper (\\d+)"))) << text;
  EXPECT_NE(::kill(std::stoi(match[1]), 0), 0) << "the dumper was not reaped";
}

TEST_F(StackDumpTest, NoToolRecordsHowToGetOne) {
  StackDumper dumper(io_, control_, StackDumpTool{});
  const pid_t target = start_sleeper();
  ASSERT_TRUE(dump(dumper, {{target, dir_ / "dump.txt"}}, kStackDumpTimeout));
  const std::string text = read_file(dir_ / "dump.txt");
  EXPECT_NE(text.find("by none at "), std::string::npos) << text;
  EXPECT_NE(text.find("no stack dumper found (install gdb or py-spy)"), std::string::npos);
}

TEST_F(StackDumpTest, FailedDumperIsNotedAndItsTargetResumed) {
  StackDumper dumper(io_, control_, fake_py_spy("kill -STOP \"$4\"\necho cannot attach\nexit 3"));
  const pid_t target = start_sleeper();
  ASSERT_TRUE(dump(dumper, {{target, dir_ / "dump.txt"}}, kStackDumpTimeout));
  const std::string text = read_file(dir_ / "dump.txt");
  EXPECT_NE(text.find("cannot attach\n# mcprun: py-spy ended with exit code 3"), std::string::npos)
      << text;
  EXPECT_FALSE(stopped(target)) << process_state(target);
}

TEST_F(StackDumpTest, LauncherReapingTheDumperFirstIsHarmless) {
  // The launcher's SIGCHLD handler reaps with waitpid(-1) and may take the dumper's exit first.
  boost::asio::signal_set sigchld(io_, SIGCHLD);
  std::vector<ProcessExit> taken;
  std::function<void()> reap_on_sigchld = [&] {
    sigchld.async_wait([&](boost::system::error_code ec, int) {
      if (ec) return;
      for (const ProcessExit& exit : control_.reap()) taken.push_back(exit);
      reap_on_sigchld();
    });
  };
  reap_on_sigchld();
  StackDumper dumper(io_, control_, fake_py_spy("echo dumped \"$4\""));
  const pid_t target = start_sleeper();
  for (int round = 0; round < 5; ++round) {
    const auto file = dir_ / ("dump" + std::to_string(round) + ".txt");
    ASSERT_TRUE(dump(dumper, {{target, file}}, kStackDumpTimeout));
    const std::string text = read_file(file);
    EXPECT_NE(text.find("dumped " + std::to_string(target)), std::string::npos) << text;
  }
  EXPECT_FALSE(stopped(target)) << process_state(target);
}

TEST_F(StackDumpTest, DestroyingTheDumperKillsItsDumpersAndResumesTargets) {
  const pid_t target = start_sleeper();
  bool done = false;
  {
    StackDumper dumper(io_, control_, fake_py_spy("kill -STOP \"$4\"\necho stopped\nsleep 60"));
    dumper.dump_all({{target, dir_ / "dump.txt"}}, kStackDumpTimeout, [&] { done = true; });
    ASSERT_TRUE(poll_until(
        io_, [&] { return process_state(target) == 'T'; }, kTestDeadline));
  }
  run_until(
      io_, [] { return false; }, kPollSlice);  // Runs the handlers the destructor aborted.
  EXPECT_FALSE(done);
  EXPECT_FALSE(stopped(target)) << process_state(target);
  EXPECT_NE(read_file(dir_ / "dump.txt")
                .find("py-spy was still running when mcprun stopped "
                      "dumping; killed it"),
            std::string::npos);
}

TEST_F(StackDumpTest, EmptyBatchCompletes) {
  StackDumper dumper(io_, control_, StackDumpTool{});
  EXPECT_TRUE(dump(dumper, {}, kStackDumpTimeout));
}

}  // namespace
}  // namespace mcprun
