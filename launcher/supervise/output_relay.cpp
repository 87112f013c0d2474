#include "launcher/supervise/output_relay.hpp"

#include <fcntl.h>
#include <pty.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/logging.hpp"

namespace mcprun {
namespace {

void write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // Console gone (closed pipe): keep logging to files regardless.
    text.remove_prefix(static_cast<size_t>(n));
  }
}

/// Where the control sequence at text[start] (an ESC) ends, one past its last byte; npos when
/// the text ends first.
size_t control_sequence_end(std::string_view text, size_t start) {
  if (start + 1 >= text.size()) return std::string_view::npos;
  const char kind = text[start + 1];
  if (kind == '[') {  // CSI: parameters, then one final byte in @..~.
    for (size_t i = start + 2; i < text.size(); ++i)
      if (text[i] >= '@' && text[i] <= '~') return i + 1;
    return std::string_view::npos;
  }
  if (kind == ']') {  // OSC (a window title, a link): up to BEL or ESC backslash.
    for (size_t i = start + 2; i < text.size(); ++i) {
      if (text[i] == '\a') return i + 1;
      if (text[i] == 0x1b) return i + 1 < text.size() ? i + 2 : std::string_view::npos;
    }
    return std::string_view::npos;
  }
  return start + 2;  // ESC and one byte (a character set, a keypad mode).
}

bool continuation_byte(char c) { return (static_cast<unsigned char>(c) & 0xc0) == 0x80; }

/// `prefix` and a line's `text` as the console shows them. Control sequences at the text's start
/// that act on the line rather than colour the text (rich's "\x1b[2K" erases the whole line
/// before each redraw, and would erase the prefix) go before the prefix.
std::string prefixed(std::string_view prefix, std::string_view text) {
  size_t line_controls = 0;
  while (line_controls + 1 < text.size() && text[line_controls] == 0x1b &&
         text[line_controls + 1] == '[') {
    const size_t end = control_sequence_end(text, line_controls);
    if (end == std::string_view::npos || text[end - 1] == 'm') break;  // 'm': a colour.
    line_controls = end;
  }
  std::string out;
  out.reserve(prefix.size() + text.size() + 2);
  out.append(text.substr(0, line_controls)).append(prefix).append(text.substr(line_controls));
  return out;
}

/// Whether two descriptors write to one terminal, pipe or file.
bool same_file(int a, int b) {
  struct stat first {
  }, second{};
  if (::fstat(a, &first) != 0 || ::fstat(b, &second) != 0) return false;
  if (S_ISCHR(first.st_mode) && S_ISCHR(second.st_mode)) return first.st_rdev == second.st_rdev;
  return first.st_dev == second.st_dev && first.st_ino == second.st_ino;
}

bool identifier_char(char c, bool first) {
  return c == '_' || std::isalpha(static_cast<unsigned char>(c)) ||
         (!first && std::isdigit(static_cast<unsigned char>(c)));
}

}  // namespace

std::string console_prefix(const std::optional<std::string>& line_template, int rank,
                           int local_rank, const std::string& role_name, bool several_ranks) {
  if (!line_template) return several_ranks ? "[rank" + std::to_string(rank) + "]:" : "";
  auto value_of = [&](std::string_view name) -> std::optional<std::string> {
    if (name == "rank") return std::to_string(rank);
    if (name == "local_rank") return std::to_string(local_rank);
    if (name == "role_name") return role_name;
    return std::nullopt;
  };
  const std::string& text = *line_template;
  std::string prefix;
  for (size_t i = 0; i < text.size();) {
    if (text[i] != '$' || i + 1 == text.size()) {
      prefix += text[i++];
      continue;
    }
    if (text[i + 1] == '$') {  // "$$" is one "$".
      prefix += '$';
      i += 2;
      continue;
    }
    const bool braced = text[i + 1] == '{';
    const size_t start = i + 1 + braced;
    size_t end = start;
    while (end < text.size() && identifier_char(text[end], end == start)) ++end;
    const bool closed = !braced || (end < text.size() && text[end] == '}');
    auto value = end > start && closed ? value_of(std::string_view(text).substr(start, end - start))
                                       : std::nullopt;
    if (!value) {  // Not a known name: left as written.
      prefix += text[i++];
      continue;
    }
    prefix += *value;
    i = end + braced;
  }
  return prefix;
}

std::string printable_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == 0x1b && i + 1 < text.size()) {  // An unfinished sequence takes the rest.
      i = std::min(control_sequence_end(text, i), text.size()) - 1;
      continue;
    }
    if (c >= 0x20 && c != 0x7f)
      out += static_cast<char>(c);
    else if (c == '\t')
      out += ' ';
  }
  return out;
}

size_t display_width(std::string_view text) {
  const std::string shown = printable_text(text);
  return static_cast<size_t>(
      std::count_if(shown.begin(), shown.end(), [](char c) { return !continuation_byte(c); }));
}

winsize rank_window(const winsize& console, std::string_view prefix) {
  if (console.ws_col == 0) return console;  // A size the terminal does not know stays unknown.
  const size_t prefix_columns = display_width(prefix);
  winsize rank = console;
  // A prefix as wide as the console still leaves the worker a column.
  rank.ws_col = prefix_columns < console.ws_col
                    ? static_cast<unsigned short>(console.ws_col - prefix_columns)
                    : 1;
  rank.ws_xpixel = static_cast<unsigned short>(console.ws_xpixel / console.ws_col * rank.ws_col);
  return rank;
}

size_t complete_length(std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != 0x1b) continue;
    const size_t end = control_sequence_end(text, i);
    if (end == std::string_view::npos) {
      text = text.substr(0, i);
      break;
    }
    i = end - 1;
  }
  // The last character's lead byte, and how many bytes it announces.
  size_t lead = text.size();
  while (lead > 0 && text.size() - lead < 3 && continuation_byte(text[lead - 1])) --lead;
  if (lead == 0) return text.size();
  --lead;
  const unsigned char c = static_cast<unsigned char>(text[lead]);
  const size_t announced = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
  return text.size() - lead < announced ? lead : text.size();
}

Console::Console(int fd) : fd_(fd), terminal_(::isatty(fd) == 1) {}

Console::Console(int fd, const Console& other) : Console(fd) {
  if (same_file(fd, other.fd_)) cursor_ = other.cursor_;
}

std::optional<winsize> Console::window_size() const {
  winsize size{};
  if (!terminal_ || ::ioctl(fd_, TIOCGWINSZ, &size) != 0) return std::nullopt;
  return size;
}

void Console::write_line(const void* source, std::string_view prefix, std::string_view text) {
  // One write per line: lines of different ranks never interleave mid-line.
  std::string line;
  Cursor& cursor = *cursor_;
  const bool below_another = cursor.open_line && cursor.open_line != source;
  if (cursor.open_line == source) line += '\r';  // The final state replaces ours.
  // On a terminal the line takes the other's progress line's place and that line is drawn
  // again below it, as tqdm.write does; elsewhere nothing can be erased and it stays a line.
  else if (below_another)
    line += terminal_ ? "\r\x1b[K" : "\n";
  line.append(prefixed(prefix, text)).push_back('\n');
  if (below_another && terminal_) {
    line += cursor.drawn;
  } else {
    cursor.open_line = nullptr;
    cursor.drawn.clear();
  }
  write(line);
}

void Console::write_progress(const void* source, std::string_view prefix, std::string_view text) {
  Cursor& cursor = *cursor_;
  std::string update;
  // Another's progress line gives way: on a terminal it is erased (written out again when it
  // ends), elsewhere it stays as it is, a line of its own.
  if (cursor.open_line && cursor.open_line != source) update += terminal_ ? "\r\x1b[K" : "\n";
  cursor.drawn = "\r" + prefixed(prefix, text);
  cursor.open_line = source;
  update += cursor.drawn;
  write(update);
}

void Console::end_progress(const void* source, std::string_view prefix, std::string_view text) {
  Cursor& cursor = *cursor_;
  if (cursor.open_line == source) {
    cursor.open_line = nullptr;
    cursor.drawn.clear();
    write("\n");
    return;
  }
  // Elsewhere the line another's update ended is still there; on a terminal that update erased
  // it, so its last state goes above the bar that took its place.
  if (!terminal_) return;
  std::string line = cursor.open_line ? "\r\x1b[K" : "";
  line.append(prefixed(prefix, text)).push_back('\n');
  line += cursor.drawn;
  write(line);
}

void Console::write(std::string_view text) { write_all(fd_, text); }

RankOutput::RankOutput(boost::asio::io_context& io, std::string prefix, StreamRoute out,
                       StreamRoute err, Console& out_console, Console& err_console)
    : prefix_(std::move(prefix)) {
  streams_[0].route = std::move(out);
  streams_[1].route = std::move(err);
  streams_[0].console = &out_console;
  streams_[1].console = &err_console;
  for (int i = 0; i < 2; ++i) {
    Stream& stream = streams_[i];
    stream.reader = std::make_unique<boost::asio::posix::stream_descriptor>(
        io, open_stream(stream, i).release());
    if (!stream.route.log_file.empty()) {
      stream.log = std::fopen(stream.route.log_file.c_str(), "we");
      if (!stream.log)
        throw std::runtime_error("cannot write " + stream.route.log_file.string() + ": " +
                                 std::strerror(errno));
    }
  }
}

UniqueFd RankOutput::open_stream(Stream& stream, int index) {
  if (stream.route.to_console && stream.console->is_terminal()) {
    int master = -1, slave = -1;
    winsize size =
        rank_window(stream.console->window_size().value_or(winsize{24, 80, 0, 0}), prefix_);
    if (::openpty(&master, &slave, nullptr, nullptr, &size) == 0) {
      UniqueFd reader(master);
      child_ends_[index].reset(slave);
      // Raw: the worker's bytes pass as written ("\n" stays "\n"), and nothing echoes.
      termios mode{};
      ::tcgetattr(slave, &mode);
      ::cfmakeraw(&mode);
      ::tcsetattr(slave, TCSANOW, &mode);
      ::fcntl(master, F_SETFD, FD_CLOEXEC);
      ::fcntl(slave, F_SETFD, FD_CLOEXEC);
      stream.terminal = true;
      return reader;
    }
    // Out of pseudo-terminals (kernel.pty.max): this rank gets a pipe, as without a terminal.
    spdlog::debug("openpty: {}; rank output goes through a pipe", std::strerror(errno));
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
  child_ends_[index].reset(fds[1]);
  return UniqueFd(fds[0]);
}

void RankOutput::resize(const winsize& size) {
  const winsize window = rank_window(size, prefix_);
  for (Stream& stream : streams_)
    if (stream.terminal && stream.reader->is_open())
      ::ioctl(stream.reader->native_handle(), TIOCSWINSZ, &window);
}

void RankOutput::close_child_ends() {
  child_ends_[0].reset();
  child_ends_[1].reset();
}

void RankOutput::start() {
  open_streams_ = 2;
  last_output_ = std::chrono::steady_clock::now();
  for (Stream& stream : streams_) read_more(stream);
}

void RankOutput::read_more(Stream& stream) {
  stream.reader->async_read_some(boost::asio::buffer(stream.buffer),
                                 [this, &stream](boost::system::error_code ec, size_t n) {
                                   // EOF; EIO from a pseudo-terminal once the worker closed it; or
                                   // closed by finish().
                                   if (ec) {
                                     if (ec != boost::asio::error::operation_aborted)
                                       close_stream(stream);
                                     return;
                                   }
                                   std::string_view chunk(stream.buffer.data(), n);
                                   write_log(stream, chunk);
                                   relay(stream, chunk);
                                   read_more(stream);
                                 });
}

void RankOutput::relay(Stream& stream, std::string_view chunk) {
  for (size_t end; (end = chunk.find_first_of("\r\n")) != std::string_view::npos;) {
    stream.partial.append(chunk.substr(0, end));
    if (chunk[end] == '\n') {
      end_line(stream);
    } else {  // "text\r": text is an update; "\rtext" (tqdm) shows at the chunk's end below.
      show_progress(stream, true);
      stream.partial.clear();
      stream.carriage = true;
    }
    chunk.remove_prefix(end + 1);
  }
  stream.partial.append(chunk);
  // A progress line's latest state is shown now, not when its line ends; a plain partial line
  // waits for its newline, so that lines never interleave mid-line.
  if (stream.carriage) show_progress(stream, false);
}

void RankOutput::show_progress(Stream& stream, bool whole) {
  // A read may end in half a character or half a colour: that part waits for the next read.
  const std::string_view ready =
      std::string_view(stream.partial)
          .substr(0, whole ? stream.partial.size() : complete_length(stream.partial));
  if (ready.empty() || ready == stream.shown) return;
  last_output_ = std::chrono::steady_clock::now();
  stream.shown = ready;
  const bool copied = stderr_copy_ && &stream == &streams_[1];
  if (stream.route.to_console && !copied)
    stream.console->write_progress(&stream, prefix_, stream.shown);
}

void RankOutput::end_line(Stream& stream) {
  const bool bare_end = stream.carriage && stream.partial.empty();  // "...\r\n": shown stays.
  const std::string line = bare_end ? stream.shown : stream.partial;
  stream.partial.clear();
  stream.shown.clear();
  stream.carriage = false;
  last_output_ = std::chrono::steady_clock::now();
  if (stderr_copy_ && &stream == &streams_[1]) {
    stderr_copy_->emplace_back(line);  // The stack dump file has it; the console has the report.
    return;
  }
  if (stream.route.to_console) {
    if (bare_end)
      stream.console->end_progress(&stream, prefix_, line);
    else
      stream.console->write_line(&stream, prefix_, line);
  }
  tail_.push_back(line);
  if (tail_.size() > kTailLines) tail_.pop_front();
}

void RankOutput::close_stream(Stream& stream) {
  if (!stream.reader->is_open()) return;
  if (!stream.partial.empty() || !stream.shown.empty()) end_line(stream);
  boost::system::error_code ignored;
  stream.reader->close(ignored);
  close_log(stream);
  --open_streams_;
}

void RankOutput::write_log(Stream& stream, std::string_view chunk) {
  if (!stream.log) return;
  if (std::fwrite(chunk.data(), 1, chunk.size(), stream.log) == chunk.size()) return;
  spdlog::warn("cannot write {}: {}; that log stops here (the console still gets the output)",
               stream.route.log_file.string(), std::strerror(errno));
  std::fclose(stream.log);
  stream.log = nullptr;
}

void RankOutput::close_log(Stream& stream) {
  if (!stream.log) return;
  // What stdio still buffered is written now: a full disk shows here if not before.
  if (std::fclose(stream.log) != 0)
    spdlog::warn("cannot write {}: {}; that log is incomplete", stream.route.log_file.string(),
                 std::strerror(errno));
  stream.log = nullptr;
}

void RankOutput::finish() {
  for (Stream& stream : streams_) close_stream(stream);
}

}  // namespace mcprun
