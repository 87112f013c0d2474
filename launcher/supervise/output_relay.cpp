#include "launcher/supervise/output_relay.hpp"

#include <fcntl.h>
#include <pty.h>
#include <termios.h>
#include <unistd.h>

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
    if (c == 0x1b && i + 1 < text.size()) {
      const char kind = text[++i];
      if (kind == '[') {  // CSI: parameters, then one final byte in @..~.
        while (i + 1 < text.size() && !(text[i + 1] >= '@' && text[i + 1] <= '~')) ++i;
        ++i;
      } else if (kind == ']') {  // OSC (a window title, a link): up to BEL or ESC backslash.
        while (i + 1 < text.size() && text[i + 1] != '\a' && text[i + 1] != 0x1b) ++i;
        ++i;
        if (i < text.size() && text[i] == 0x1b) ++i;
      }
      continue;
    }
    if (c >= 0x20 && c != 0x7f) out += static_cast<char>(c);
    else if (c == '\t') out += ' ';
  }
  return out;
}

Console::Console(int fd) : fd_(fd), terminal_(::isatty(fd) == 1) {}

std::optional<winsize> Console::window_size() const {
  winsize size{};
  if (!terminal_ || ::ioctl(fd_, TIOCGWINSZ, &size) != 0) return std::nullopt;
  return size;
}

void Console::write_line(const void* source, std::string_view prefix, std::string_view text) {
  // One write per line: lines of different ranks never interleave mid-line.
  std::string line;
  line.reserve(prefix.size() + text.size() + 2);
  if (open_line_ && open_line_ != source) line += '\n';  // Another rank's progress line stays.
  else if (open_line_ == source) line += '\r';            // The final state replaces ours.
  line.append(prefix).append(text).push_back('\n');
  open_line_ = nullptr;
  write(line);
}

void Console::write_progress(const void* source, std::string_view prefix, std::string_view text) {
  std::string update;
  update.reserve(prefix.size() + text.size() + 2);
  if (open_line_ && open_line_ != source) update += '\n';
  update.append("\r").append(prefix).append(text);
  open_line_ = source;
  write(update);
}

void Console::end_progress(const void* source) {
  if (open_line_ != source) return;  // Another rank's line already ended it.
  open_line_ = nullptr;
  write("\n");
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
    stream.reader =
        std::make_unique<boost::asio::posix::stream_descriptor>(io, open_stream(stream, i).release());
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
    winsize size = stream.console->window_size().value_or(winsize{24, 80, 0, 0});
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
  for (Stream& stream : streams_)
    if (stream.terminal && stream.reader->is_open())
      ::ioctl(stream.reader->native_handle(), TIOCSWINSZ, &size);
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
  stream.reader->async_read_some(
      boost::asio::buffer(stream.buffer), [this, &stream](boost::system::error_code ec, size_t n) {
        // EOF; EIO from a pseudo-terminal once the worker closed it; or closed by finish().
        if (ec) {
          if (ec != boost::asio::error::operation_aborted) close_stream(stream);
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
      show_progress(stream);
      stream.partial.clear();
      stream.carriage = true;
    }
    chunk.remove_prefix(end + 1);
  }
  stream.partial.append(chunk);
  // A progress line's latest state is shown now, not when its line ends; a plain partial line
  // waits for its newline, so that lines never interleave mid-line.
  if (stream.carriage) show_progress(stream);
}

void RankOutput::show_progress(Stream& stream) {
  if (stream.partial.empty() || stream.partial == stream.shown) return;
  last_output_ = std::chrono::steady_clock::now();
  stream.shown = stream.partial;
  const bool copied = stderr_copy_ && &stream == &streams_[1];
  if (stream.route.to_console && !copied) stream.console->write_progress(&stream, prefix_, stream.shown);
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
    if (bare_end) stream.console->end_progress(&stream);
    else stream.console->write_line(&stream, prefix_, line);
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
