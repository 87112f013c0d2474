#include "launcher/supervise/output_relay.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <string>

#include "common/event_loop.hpp"
#include "common/unique_fd.hpp"

namespace mcprun {
namespace {

// Only a failure waits this long: a loaded box (ctest -j beside ASan) can delay a read by seconds.
constexpr std::chrono::seconds kWaitAtMost{10};

TEST(ConsolePrefix, DefaultIsRankWhenSeveral) {
  EXPECT_EQ(console_prefix(std::nullopt, 3, 1, "default", true), "[rank3]:");
  EXPECT_EQ(console_prefix(std::nullopt, 0, 0, "default", false), "");
}

TEST(ConsolePrefix, TorchrunTemplateMacros) {
  EXPECT_EQ(console_prefix("[rank${rank}]: ", 5, 1, "default", true), "[rank5]: ");
  EXPECT_EQ(console_prefix("[${role_name}${local_rank}]:", 5, 1, "trainer", true), "[trainer1]:");
  EXPECT_EQ(console_prefix("$role_name/$rank:", 2, 0, "w", false),
            "w/2:");  // Applies to one rank too.
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
    for (ssize_t n; (n = ::read(read_end.get(), buffer, sizeof buffer)) > 0;)
      text.append(buffer, n);
    return text;
  }
};

/// A console that is a terminal, raw so that its bytes read back as written: mcprun's stdout
/// and stderr on one screen.
struct TerminalConsole {
  UniqueFd screen, terminal;
  explicit TerminalConsole(winsize size = {24, 80, 0, 0}) {
    int master = -1, slave = -1;
    EXPECT_EQ(::openpty(&master, &slave, nullptr, nullptr, &size), 0);
    screen.reset(master);
    terminal.reset(slave);
    termios mode{};
    ::tcgetattr(slave, &mode);
    ::cfmakeraw(&mode);
    ::tcsetattr(slave, TCSANOW, &mode);
  }
  /// What reached the screen, once it holds `expected` bytes or kWaitAtMost passed.
  std::string read(size_t expected) const {
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + kWaitAtMost;
    char buffer[4096];
    while (text.size() < expected && std::chrono::steady_clock::now() < deadline) {
      pollfd ready{screen.get(), POLLIN, 0};
      if (::poll(&ready, 1, 50) != 1) continue;
      const ssize_t n = ::read(screen.get(), buffer, sizeof buffer);
      if (n <= 0) break;
      text.append(buffer, static_cast<size_t>(n));
    }
    return text;
  }
};

void write_to(int fd, std::string_view text) {
  ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
}

/// Runs the loop until the console has `expected` bytes or kWaitAtMost passes.
std::string read_console(boost::asio::io_context& io, const PipeConsole& console, size_t expected) {
  std::string seen;
  run_until(
      io,
      [&] {
        seen += console.drain();
        return seen.size() >= expected;
      },
      kWaitAtMost);
  return seen;
}

TEST(PrintableText, DropsControlSequencesKeepsText) {
  EXPECT_EQ(printable_text("\x1b[31mred\x1b[0m plain"), "red plain");
  EXPECT_EQ(printable_text("\x1b]0;title\abar\x1b[2K"), "bar");
  EXPECT_EQ(printable_text("a\tb\x01"
                           "c\x7f"),
            "a bc");
  EXPECT_EQ(printable_text("50%|#####     | 5/10"), "50%|#####     | 5/10");
}

TEST(PrintableText, AnUnfinishedSequenceShowsNothingOfIt) {
  EXPECT_EQ(printable_text("text\x1b[3"), "text");
  EXPECT_EQ(printable_text("text\x1b"), "text");
  EXPECT_EQ(printable_text("\x1b]8;;http://x\x1b\\link"), "link");
}

TEST(DisplayWidth, CountsCharactersNotBytesOrControlSequences) {
  EXPECT_EQ(display_width("[rank0]:"), 8u);
  EXPECT_EQ(display_width("[r\xc3\xa5nk0]:"), 8u);  // "å" is two bytes, one column.
  EXPECT_EQ(display_width("\x1b[32m[w1]\x1b[0m "), 5u);
  EXPECT_EQ(display_width(""), 0u);
}

TEST(RankWindow, IsTheConsoleLessThePrefix) {
  const winsize console{30, 120, 960, 480};
  const winsize rank = rank_window(console, "[rank0]:");
  EXPECT_EQ(rank.ws_col, 112);
  EXPECT_EQ(rank.ws_row, 30);
  EXPECT_EQ(rank.ws_xpixel, 896);  // The same 8-pixel cells.
  EXPECT_EQ(rank.ws_ypixel, 480);
  EXPECT_EQ(rank_window(console, "").ws_col, 120);  // No prefix: the whole width.
  EXPECT_EQ(rank_window(console, "[rank10]: ").ws_col, 110);
  EXPECT_EQ(rank_window(winsize{24, 8, 0, 0}, "[rank0]:").ws_col, 1);
  EXPECT_EQ(rank_window(winsize{0, 0, 0, 0}, "[rank0]:").ws_col, 0);  // Unknown stays unknown.
}

TEST(CompleteLength, HoldsBackAnUnfinishedCharacterOrSequence) {
  EXPECT_EQ(complete_length(" 50%|\xe2\x96\x88|"), 9u);
  EXPECT_EQ(complete_length(" 50%|\xe2\x96"), 5u);
  EXPECT_EQ(complete_length(" 50%|\xe2"), 5u);
  EXPECT_EQ(complete_length("\xf0\x9f\x9a\x80"), 4u);
  EXPECT_EQ(complete_length("\xf0\x9f\x9a"), 0u);
  EXPECT_EQ(complete_length("text\x1b[38;5;2"), 4u);
  EXPECT_EQ(complete_length("text\x1b"), 4u);
  EXPECT_EQ(complete_length("\x1b]8;;http://x\x1b\\link"), 19u);
  EXPECT_EQ(complete_length("\x1b]8;;http://x\x1b"), 0u);
  EXPECT_EQ(complete_length("\x1b[0m done"), 9u);
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

TEST(Console, StdoutAndStderrOnOneScreenShareOneCursor) {
  PipeConsole screen;
  UniqueFd same_screen(::fcntl(screen.write_end.get(), F_DUPFD_CLOEXEC, 0));
  Console out(screen.write_end.get()), err(same_screen.get(), out);
  int rank0_err = 0, rank1_out = 1;
  err.write_progress(&rank0_err, "[rank0]:", " 98%");
  out.write_line(&rank1_out, "[rank1]:", "rank 1 done");
  err.write_progress(&rank0_err, "[rank0]:", "100%");
  err.end_progress(&rank0_err, "[rank0]:", "100%");
  EXPECT_EQ(screen.drain(), "\r[rank0]: 98%\n[rank1]:rank 1 done\n\r[rank0]:100%\n");
}

TEST(Console, OnATerminalAnotherRanksLineGoesAboveTheProgressLine) {
  TerminalConsole screen;
  UniqueFd same_screen(::fcntl(screen.terminal.get(), F_DUPFD_CLOEXEC, 0));
  Console out(screen.terminal.get()), err(same_screen.get(), out);
  ASSERT_TRUE(err.is_terminal());
  int rank0_err = 0, rank1_out = 1;
  err.write_progress(&rank0_err, "[rank0]:", " 98%");
  out.write_line(&rank1_out, "[rank1]:", "rank 1 done");  // Erases the bar, draws it below.
  err.write_progress(&rank0_err, "[rank0]:", "100%");
  err.end_progress(&rank0_err, "[rank0]:", "100%");
  const std::string expected =
      "\r[rank0]: 98%"
      "\r\x1b[K[rank1]:rank 1 done\n\r[rank0]: 98%"
      "\r[rank0]:100%\n";
  EXPECT_EQ(screen.read(expected.size()), expected);
}

TEST(Console, OnATerminalTheLatestRanksBarTakesTheProgressLineAndEachEndsAsALine) {
  TerminalConsole screen;
  Console out(screen.terminal.get()), err(screen.terminal.get(), out);
  int rank0_err = 0, rank1_err = 1;
  err.write_progress(&rank0_err, "[rank0]:", " 10%");
  err.write_progress(&rank1_err, "[rank1]:", " 10%");
  err.write_progress(&rank0_err, "[rank0]:", " 20%");
  err.end_progress(&rank1_err, "[rank1]:", " 10%");  // Goes above rank 0's bar.
  err.end_progress(&rank0_err, "[rank0]:", " 20%");
  const std::string expected =
      "\r[rank0]: 10%"
      "\r\x1b[K\r[rank1]: 10%"
      "\r\x1b[K\r[rank0]: 20%"
      "\r\x1b[K[rank1]: 10%\n\r[rank0]: 20%"
      "\n";
  EXPECT_EQ(screen.read(expected.size()), expected);
}

TEST(Console, ABarThatGaveWayToOneThatEndedIsWrittenOutWhenItEnds) {
  TerminalConsole screen;
  Console console(screen.terminal.get());
  int rank0 = 0, rank1 = 1;
  console.write_progress(&rank0, "[rank0]:", " 50%");
  console.write_progress(&rank1, "[rank1]:", "100%");
  console.end_progress(&rank1, "[rank1]:", "100%");
  console.end_progress(&rank0, "[rank0]:", " 50%");
  const std::string expected =
      "\r[rank0]: 50%"
      "\r\x1b[K\r[rank1]:100%"
      "\n"
      "[rank0]: 50%\n";
  EXPECT_EQ(screen.read(expected.size()), expected);
}

TEST(Console, WhereNothingCanBeErasedAnotherRanksUpdateEndsTheProgressLine) {
  PipeConsole pipe;
  Console console(pipe.write_end.get());
  int rank0 = 0, rank1 = 1;
  console.write_progress(&rank0, "[rank0]:", " 10%");
  console.write_progress(&rank1, "[rank1]:", " 10%");
  console.end_progress(&rank0, "[rank0]:", " 10%");  // Its line is there already.
  console.end_progress(&rank1, "[rank1]:", " 10%");
  EXPECT_EQ(pipe.drain(), "\r[rank0]: 10%\n\r[rank1]: 10%\n");
}

TEST(Console, StreamsToDifferentFilesKeepACursorEach) {
  PipeConsole out_file, err_file;
  Console out(out_file.write_end.get()), err(err_file.write_end.get(), out);
  int rank0_err = 0, rank1_out = 1;
  err.write_progress(&rank0_err, "[rank0]:", " 98%");
  out.write_line(&rank1_out, "[rank1]:", "rank 1 done");
  err.end_progress(&rank0_err, "[rank0]:", " 98%");
  EXPECT_EQ(out_file.drain(), "[rank1]:rank 1 done\n");
  EXPECT_EQ(err_file.drain(), "\r[rank0]: 98%\n");
}

TEST(Console, ALineErasedBeforeEachRedrawKeepsItsPrefix) {
  PipeConsole pipe;
  Console console(pipe.write_end.get());
  int rank0 = 0;
  // rich's shape: erase the line, then the bar, coloured.
  console.write_progress(&rank0, "[rank0]:", "\x1b[2Kepoch \x1b[35m 50%\x1b[0m");
  console.write_line(&rank0, "[rank0]:", "\x1b[2K\x1b[?25lepoch \x1b[35m100%\x1b[0m");
  EXPECT_EQ(pipe.drain(),
            "\r\x1b[2K[rank0]:epoch \x1b[35m 50%\x1b[0m"
            "\r\x1b[2K\x1b[?25l[rank0]:epoch \x1b[35m100%\x1b[0m\n");
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
  run_until(
      io, [] { return false; }, std::chrono::milliseconds(50));
  write_to(rank.child_stdout(), "ne\n");
  EXPECT_EQ(read_console(io, out, 20), "[rank0]:half a line\n");
  write_to(rank.child_stdout(), "\x1b[32mgreen\x1b[0m\n");
  EXPECT_EQ(read_console(io, out, 23), "[rank0]:\x1b[32mgreen\x1b[0m\n");
  rank.close_child_ends();
  run_until(
      io, [&] { return rank.drained(); }, kWaitAtMost);
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
  RankOutput rank{io, "",          {.to_console = true, .log_file = "/dev/full"},
                  {}, out_console, err_console};

  RankLoggingToAFullDisk() { rank.start(); }
  void close() {
    rank.close_child_ends();
    run_until(
        io, [&] { return rank.drained(); }, kWaitAtMost);
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
  EXPECT_NE(text.find("cannot write /dev/full: No space left on device"), std::string::npos)
      << text;
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
  EXPECT_NE(
      said.text().find("cannot write /dev/full: No space left on device; that log is incomplete"),
      std::string::npos)
      << said.text();
}

TEST(RankOutput, AReadThatSplitsACharacterShowsItWhenItsLastByteComes) {
  boost::asio::io_context io;
  PipeConsole out, err;
  Console out_console(out.write_end.get()), err_console(err.write_end.get());
  RankOutput rank(io, "[rank0]:", {}, {}, out_console, err_console);
  rank.start();
  write_to(rank.child_stdout(), "\r 50%|\xe2\x96");  // Half of tqdm's "\u2588".
  EXPECT_EQ(read_console(io, out, 14), "\r[rank0]: 50%|");
  write_to(rank.child_stdout(), "\x88");
  EXPECT_EQ(read_console(io, out, 17), "\r[rank0]: 50%|\xe2\x96\x88");
  rank.close_child_ends();
  run_until(
      io, [&] { return rank.drained(); }, kWaitAtMost);
}

TEST(RankOutput, AWorkerBehindAPrefixGetsATerminalThatMuchNarrower) {
  int master = -1, slave = -1;
  winsize size{40, 132, 0, 0};
  ASSERT_EQ(::openpty(&master, &slave, nullptr, nullptr, &size), 0);
  UniqueFd terminal_master(master), terminal(slave);
  boost::asio::io_context io;
  Console out_console(terminal.get()), err_console(terminal.get(), out_console);
  RankOutput rank(io, "[rank1]:", {}, {}, out_console, err_console);
  for (int child_end : {rank.child_stdout(), rank.child_stderr()}) {
    winsize seen{};
    ASSERT_EQ(::ioctl(child_end, TIOCGWINSZ, &seen), 0);
    EXPECT_EQ(seen.ws_col, 124);
    EXPECT_EQ(seen.ws_row, 40);
  }
  rank.resize(winsize{50, 100, 0, 0});  // SIGWINCH.
  winsize seen{};
  ASSERT_EQ(::ioctl(rank.child_stderr(), TIOCGWINSZ, &seen), 0);
  EXPECT_EQ(seen.ws_col, 92);
  EXPECT_EQ(seen.ws_row, 50);
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
  run_until(
      io, [&] { return rank.drained(); }, kWaitAtMost);
  ASSERT_EQ(rank.tail().size(), 1u);
  EXPECT_EQ(rank.tail()[0], "line");
}

}  // namespace
}  // namespace mcprun
