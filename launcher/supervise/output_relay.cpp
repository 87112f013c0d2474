#include "launcher/supervise/output_relay.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <boost/asio/buffer.hpp>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <stdexcept>

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

RankOutput::RankOutput(boost::asio::io_context& io, std::string prefix, StreamRoute out,
                       StreamRoute err)
    : prefix_(std::move(prefix)) {
  StreamRoute routes[2] = {std::move(out), std::move(err)};
  for (int i = 0; i < 2; ++i) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
      throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
    child_ends_[i].reset(fds[1]);
    Stream& stream = streams_[i];
    stream.pipe = std::make_unique<boost::asio::posix::stream_descriptor>(io, fds[0]);
    stream.route = std::move(routes[i]);
    stream.console_fd = i == 0 ? STDOUT_FILENO : STDERR_FILENO;
    if (!stream.route.log_file.empty()) {
      stream.log = std::fopen(stream.route.log_file.c_str(), "we");
      if (!stream.log)
        throw std::runtime_error("cannot write " + stream.route.log_file.string() + ": " +
                                 std::strerror(errno));
    }
  }
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
  stream.pipe->async_read_some(
      boost::asio::buffer(stream.buffer), [this, &stream](boost::system::error_code ec, size_t n) {
        if (ec) {  // EOF, or the pipe was closed by finish().
          if (ec != boost::asio::error::operation_aborted) close_stream(stream);
          return;
        }
        std::string_view chunk(stream.buffer.data(), n);
        if (stream.log) std::fwrite(chunk.data(), 1, chunk.size(), stream.log);
        for (size_t newline; (newline = chunk.find('\n')) != std::string_view::npos;) {
          stream.partial.append(chunk.substr(0, newline));
          emit_line(stream, stream.partial);
          stream.partial.clear();
          chunk.remove_prefix(newline + 1);
        }
        stream.partial.append(chunk);
        read_more(stream);
      });
}

void RankOutput::emit_line(Stream& stream, std::string_view line) {
  if (stderr_copy_ && &stream == &streams_[1]) {
    stderr_copy_->emplace_back(line);  // The stack dump file has it; the console has the report.
    return;
  }
  if (stream.route.to_console) {
    // One write per line: lines of different ranks never interleave mid-line.
    std::string text;
    text.reserve(prefix_.size() + line.size() + 1);
    text.append(prefix_).append(line).push_back('\n');
    write_all(stream.console_fd, text);
  }
  last_output_ = std::chrono::steady_clock::now();
  tail_.emplace_back(line);
  if (tail_.size() > kTailLines) tail_.pop_front();
}

void RankOutput::close_stream(Stream& stream) {
  if (!stream.pipe->is_open()) return;
  if (!stream.partial.empty()) {
    emit_line(stream, stream.partial);
    stream.partial.clear();
  }
  boost::system::error_code ignored;
  stream.pipe->close(ignored);
  if (stream.log) {
    std::fclose(stream.log);
    stream.log = nullptr;
  }
  --open_streams_;
}

void RankOutput::finish() {
  for (Stream& stream : streams_) close_stream(stream);
}

}  // namespace mcprun
