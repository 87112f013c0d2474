#include "launcher/supervise/output_relay.hpp"

#include <fcntl.h>
#include <pty.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <sstream>
#include <string>

#include "common/event_loop.hpp"
#include "common/unique_fd.hpp"

namespace mcprun {
namespace {

TEST(ConsolePrefix, DefaultIsRankWhenSeveral) {
  EXPECT_EQ(console_prefix(std::nullopt, 3, 1, "default", true), "[rank3]:");
  EXPECT_EQ(console_prefix(std::nullopt, 0, 0, "default", false), "");
}

TEST(ConsolePrefix, TorchrunTemplateMacros) {
  EXPECT_EQ(console_prefix("[rank${rank}]: ", 5, 1, "default", true), "[rank5]: ");
  EXPECT_EQ(console_prefix("[${role_name}${local_rank}]:", 5, 1, "trainer", true), "[trainer1]:");
  EXPECT_EQ(console_prefix("$role_name/$rank:", 2, 0, "w", false), "w/2:");  // Applies to one rank too.
}

TEST(ConsolePrefix, SafeSubstituteLeavesTheRestAlone) {
  EXPECT_EQ(console_prefix("$$${rank}", 1, 0, "r", true), "$1");
  EXPECT_EQ(console_prefix("${host} $ranks ${rank", 1, 0, "r", true), "${host} $ranks ${rank");
  EXPECT_EQ(console_prefix("cost $5 $", 1, 0, "r", true), "cost $5 $");
}

/// A console whose bytes the test reads back: mcprun's stdout as a pipe.
struct PipeConsole {
  UniqueFd read_end, write_end;
  PipeConsole() {
    int fds[2];
    EXPECT_EQ(::pipe2(fds, O_CLOEXEC | O_NONBLOCK), 0);
    read_end.reset(fds[0]);
    write_end.reset(fds[1]);
  }
  std::string drain() const {
    std::string text;
    char buffer[4096];
    for (ssize_t n; (n = ::read(read_end.get(), buffer, sizeof buffer)) > 0;) text.append(buffer, n);
    return text;
  }
};

void write_to(int fd, std::string_view text) {
  ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
}

/// Runs the loop until the console has `expected` bytes or a second passes.
std::string read_console(boost::asio::io_context& io, const PipeConsole& console, size_t expected) {
  std::string seen;
  run_until(io, [&] {
    seen += console.drain();
    return seen.size() >= expected;
  }, std::chrono::seconds(1));
  return seen;
}

TEST(PrintableText, DropsControlSequencesKeepsText) {
  EXPECT_EQ(printable_text("\x1b[31mred\x1b[0m plain"), "red plain");
  EXPECT_EQ(printable_text("\x1b]0;title\abar\x1b[2K"), "bar");
  EXPECT_EQ(printable_text("a\tb\x01" "c\x7f"), "a bc");
  EXPECT_EQ(printable_text("50%|#####     | 5/10"), "50%|#####     | 5/10");
}

TEST(Console, AnotherRanksLineEndsAnOpenProgressLine) {
  PipeConsole pipe;
  Console console(pipe.write_end.get());
  int rank0 = 0, rank1 = 1;
  console.write_progress(&rank0, "[rank0]:", " 10%");
  console.write_progress(&rank0, "[rank0]:", " 20%");
  console.write_line(&rank1, "[rank1]:", "loss 0.5");
  console.write_progress(&rank0, "[rank0]:", " 30%");
  console.write_line(&rank0, "[rank0]:", "100%");
  console.write_line(&rank1, "[rank1]:", "done");
  EXPECT_EQ(pipe.drain(),
            "\r[rank0]: 10%\r[rank0]: 20%\n[rank1]:loss 0.5\n\r[rank0]: 30%\r[rank0]:100%\n"
            "[rank1]:done\n");
}

TEST(RankOutput, ProgressUpdatesArriveAsWrittenAndWholeLinesStayWhole) {
  boost::asio::io_context io;
  PipeConsole out, err;
  Console out_console(out.write_end.get()), err_console(err.write_end.get());
  RankOutput rank(io, "[rank0]:", {}, {}, out_console, err_console);
  rank.start();
  write_to(rank.child_stdout(), "\rprogress 0");  // tqdm's shape: "\r" first, no end.
  EXPECT_EQ(read_console(io, out, 19), "\r[rank0]:progress 0");
  write_to(rank.child_stdout(), "\rprogress 1");
  EXPECT_EQ(read_console(io, out, 19), "\r[rank0]:progress 1");
  write_to(rank.child_stdout(), "\n");  // The bar's end: its last state becomes a line.
  EXPECT_EQ(read_console(io, out, 20), "\r[rank0]:progress 1\n");
  write_to(rank.child_stdout(), "half a li");  // A partial line waits for its newline...
  run_until(io, [] { return false; }, std::chrono::milliseconds(50));
  write_to(rank.child_stdout(), "ne\n");
  EXPECT_EQ(read_console(io, out, 20), "[rank0]:half a line\n");
  write_to(rank.child_stdout(), "\x1b[32mgreen\x1b[0m\n");
  EXPECT_EQ(read_console(io, out, 23), "[rank0]:\x1b[32mgreen\x1b[0m\n");
  rank.close_child_ends();
  run_until(io, [&] { return rank.drained(); }, std::chrono::seconds(1));
  ASSERT_TRUE(rank.drained());
  ASSERT_EQ(rank.tail().size(), 3u);
  EXPECT_EQ(rank.tail()[0], "progress 1");
  EXPECT_EQ(rank.tail()[1], "half a line");
  EXPECT_EQ(rank.tail()[2], "\x1b[32mgreen\x1b[0m");  // As written: reports quote it printable.
}

/// What mcprun logs while it lives: the default logger, pointed at a string.
class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    spdlog::set_default_logger(std::make_shared<spdlog::logger>(
        "test", std::make_shared<spdlog::sinks::ostream_sink_st>(text_)));
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  std::string text() const { return text_.str(); }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::ostringstream text_;
};

/// A rank whose log is /dev/full, where every write fails with ENOSPC, as on a full disk under
/// --log-dir; its console output goes to `out`.
struct RankLoggingToAFullDisk {
  boost::asio::io_context io;
  PipeConsole out, err;
  Console out_console{out.write_end.get()}, err_console{err.write_end.get()};
  RankOutput rank{io, "", {.to_console = true, .log_file = "/dev/full"}, {}, out_console, err_console};

  RankLoggingToAFullDisk() { rank.start(); }
  void close() {
    rank.close_child_ends();
    run_until(io, [&] { return rank.drained(); }, std::chrono::seconds(1));
  }
};

TEST(RankOutput, ALogThatCannotBeWrittenIsSaidOnceAndTheConsoleKeepsTheOutput) {
  CapturedLog said;
  RankLoggingToAFullDisk full;
  const std::string line(10000, 'x');  // Past stdio's buffer: the write itself fails.
  write_to(full.rank.child_stdout(), line + "\n");
  EXPECT_EQ(read_console(full.io, full.out, line.size() + 1), line + "\n");
  write_to(full.rank.child_stdout(), "more\n");
  EXPECT_EQ(read_console(full.io, full.out, 5), "more\n");
  full.close();
  const std::string text = said.text();
  EXPECT_NE(text.find("cannot write /dev/full: No space left on device"), std::string::npos) << text;
  EXPECT_EQ(text.find("cannot write"), text.rfind("cannot write")) << "said once: " << text;
}

TEST(RankOutput, ABufferedLogThatCannotBeWrittenIsSaidWhenItCloses) {
  CapturedLog said;
  {
    RankLoggingToAFullDisk full;
    write_to(full.rank.child_stdout(), "short\n");  // Within stdio's buffer: fails when flushed.
    EXPECT_EQ(read_console(full.io, full.out, 6), "short\n");
    full.close();
  }
  EXPECT_NE(said.text().find("cannot write /dev/full: No space left on device; that log is incomplete"),
            std::string::npos) << said.text();
}

TEST(RankOutput, AWorkerOnATerminalConsoleGetsATerminalOfItsOwnSizedAsIt) {
  int master = -1, slave = -1;
  winsize size{40, 132, 0, 0};
  ASSERT_EQ(::openpty(&master, &slave, nullptr, nullptr, &size), 0);
  UniqueFd terminal_master(master), terminal(slave);
  boost::asio::io_context io;
  PipeConsole err;
  Console out_console(terminal.get()), err_console(err.write_end.get());
  ASSERT_TRUE(out_console.is_terminal());
  RankOutput rank(io, "", {}, {}, out_console, err_console);
  EXPECT_TRUE(::isatty(rank.child_stdout()));
  EXPECT_FALSE(::isatty(rank.child_stderr()));  // stderr goes to a pipe: so does the worker's.
  winsize seen{};
  ASSERT_EQ(::ioctl(rank.child_stdout(), TIOCGWINSZ, &seen), 0);
  EXPECT_EQ(seen.ws_col, 132);
  EXPECT_EQ(seen.ws_row, 40);
  rank.resize(winsize{50, 100, 0, 0});
  ASSERT_EQ(::ioctl(rank.child_stdout(), TIOCGWINSZ, &seen), 0);
  EXPECT_EQ(seen.ws_col, 100);
  // Raw mode: a worker's "\n" reaches mcprun as "\n", not the terminal's "\r\n".
  rank.start();
  write_to(rank.child_stdout(), "line\n");
  rank.close_child_ends();
  run_until(io, [&] { return rank.drained(); }, std::chrono::seconds(1));
  ASSERT_EQ(rank.tail().size(), 1u);
  EXPECT_EQ(rank.tail()[0], "line");
}

}  // namespace
}  // namespace mcprun
