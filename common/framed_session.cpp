#include "common/framed_session.hpp"

#include <boost/asio/write.hpp>

#include <algorithm>
#include <exception>

#include "common/logging.hpp"
#include "common/messages.hpp"
#include "common/protocol.hpp"

namespace mcprun {

namespace asio = boost::asio;

FramedSession::FramedSession(Socket socket, std::string peer, SessionLimits limits)
    : socket_(std::move(socket)),
      deadline_(socket_.get_executor()),
      peer_(std::move(peer)),
      limits_(limits),
      allowance_(limits.message_burst),
      allowance_at_(std::chrono::steady_clock::now()) {}

void FramedSession::start(std::chrono::milliseconds first_message) {
  expect_message_within(first_message);
  read();
}

void FramedSession::expect_message_within(std::chrono::milliseconds limit) {
  deadline_.cancel();
  if (limit.count() <= 0 || closed_) return;
  deadline_.expires_after(limit);
  deadline_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec) return;  // Re-armed or cancelled.
    spdlog::warn("{}: silent for too long; closing", self->peer_);
    self->close();
  });
}

void FramedSession::send(const nlohmann::json& message) {
  if (closed_) return;
  std::string frame = encode_frame(message);
  if (queued_bytes_ + frame.size() > limits_.max_queued_bytes) {
    spdlog::warn("{}: {} bytes wait to be written and the peer reads none of them; closing", peer_,
                 queued_bytes_);
    return close();
  }
  queued_bytes_ += frame.size();
  const bool idle = writes_.empty();
  writes_.push_back(std::move(frame));
  if (idle) write_next();
}

void FramedSession::close_after_write() {
  close_after_write_ = true;
  if (writes_.empty()) close();
}

void FramedSession::close() {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  deadline_.cancel();
  socket_.shutdown(asio::socket_base::shutdown_both, ignored);
  socket_.close(ignored);  // A write in flight ends with operation_aborted; its buffer stays.
  try {
    on_closed();
  } catch (const std::exception& error) {
    spdlog::error("{}: closing the connection failed: {}", peer_, error.what());
  }
}

void FramedSession::read() {
  socket_.async_read_some(asio::buffer(chunk_), [self = shared_from_this()](
                                                    boost::system::error_code ec, size_t n) {
    if (self->closed_) return;
    if (ec) return self->close();
    self->buffer_.append(self->chunk_.data(), n);
    self->drain_frames();
    if (!self->closed_ && !self->close_after_write_) self->read();
  });
}

bool FramedSession::within_rate() {
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - allowance_at_).count();
  allowance_at_ = now;
  allowance_ = std::min(limits_.message_burst, allowance_ + elapsed * limits_.messages_per_second);
  if (allowance_ < 1) return false;
  allowance_ -= 1;
  return true;
}

void FramedSession::drain_frames() {
  // After a refusal or a last answer nothing more is read: the connection is ending.
  while (!closed_ && !close_after_write_) {
    FrameResult result = decode_frame(buffer_);
    if (std::holds_alternative<FrameIncomplete>(result)) return;
    if (auto* error = std::get_if<FrameError>(&result)) {
      spdlog::warn("{}: bad frame: {}; closing", peer_, error->message);
      return close();
    }
    Frame& frame = std::get<Frame>(result);
    buffer_.erase(0, frame.consumed);
    if (!within_rate()) {
      spdlog::warn("{}: more than {:g} messages a second; closing", peer_,
                   limits_.messages_per_second);
      return close();
    }
    // The one place a peer's message enters a handler: nothing it causes leaves this frame.
    try {
      on_frame(frame.message);
    } catch (const std::exception& error) {
      spdlog::warn("{}: '{}' message could not be handled: {}; closing", peer_,
                   message_type(frame.message), error.what());
      return close();
    }
  }
}

void FramedSession::write_next() {
  asio::async_write(socket_, asio::buffer(writes_.front()),
                    [self = shared_from_this()](boost::system::error_code ec, size_t) {
                      if (self->closed_) return;
                      if (ec) return self->close();
                      self->queued_bytes_ -= self->writes_.front().size();
                      self->writes_.pop_front();
                      if (!self->writes_.empty()) self->write_next();
                      else if (self->close_after_write_) self->close();
                    });
}

}  // namespace mcprun
