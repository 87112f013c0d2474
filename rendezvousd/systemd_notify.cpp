#include "rendezvousd/systemd_notify.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "common/logging.hpp"

namespace mcprun {

NotifySocket::NotifySocket(std::string_view address) {
  if (address.empty()) return;
  const bool abstract = address.front() == '@';
  if (!abstract && address.front() != '/') {
    spdlog::warn(
        "NOTIFY_SOCKET={}: only a path or an @abstract name is supported; not notifying "
        "systemd",
        address);
    return;
  }
  if (address.size() >= sizeof address_.sun_path) {
    spdlog::warn("NOTIFY_SOCKET={}: longer than a unix socket address; not notifying systemd",
                 address);
    return;
  }
  address_.sun_family = AF_UNIX;
  std::memcpy(address_.sun_path, address.data(), address.size());
  if (abstract)
    address_.sun_path[0] = '\0';  // The abstract namespace: a leading NUL, no terminator.
  address_length_ =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size() + (abstract ? 0 : 1));
  fd_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd_.valid())
    spdlog::warn("socket(AF_UNIX, SOCK_DGRAM): {}; not notifying systemd", std::strerror(errno));
}

NotifySocket NotifySocket::from_environment() {
  const char* address = std::getenv("NOTIFY_SOCKET");
  return NotifySocket(address ? address : "");
}

bool NotifySocket::send(std::string_view assignments) const {
  if (!enabled()) return false;
  const ssize_t sent =
      ::sendto(fd_.get(), assignments.data(), assignments.size(), MSG_NOSIGNAL | MSG_DONTWAIT,
               reinterpret_cast<const sockaddr*>(&address_), address_length_);
  if (sent < 0) spdlog::debug("notifying systemd: sendto: {}", std::strerror(errno));
  return sent == static_cast<ssize_t>(assignments.size());
}

std::optional<std::chrono::microseconds> watchdog_interval(const char* watchdog_usec,
                                                           const char* watchdog_pid, pid_t self) {
  if (!watchdog_usec) return std::nullopt;
  char* end = nullptr;
  const unsigned long long usec = std::strtoull(watchdog_usec, &end, 10);
  if (end == watchdog_usec || *end != '\0' || usec == 0) return std::nullopt;
  // systemd sets the pid when the variables may reach another process (a forking daemon's child).
  if (watchdog_pid && *watchdog_pid && std::strtoll(watchdog_pid, nullptr, 10) != self)
    return std::nullopt;
  return std::chrono::microseconds(usec / 2);
}

ServiceNotifier::ServiceNotifier(boost::asio::io_context& io, NotifySocket socket,
                                 std::optional<std::chrono::microseconds> watchdog,
                                 std::function<std::string()> status)
    : socket_(std::move(socket)),
      watchdog_(watchdog),
      status_(std::move(status)),
      watchdog_timer_(io),
      status_timer_(io) {}

void ServiceNotifier::ready() {
  if (!socket_.enabled()) return;
  sent_status_ = status_();
  socket_.send("READY=1\nSTATUS=" + sent_status_);
  if (started_) return;
  started_ = true;
  if (watchdog_) ping();
  refresh_status();
}

void ServiceNotifier::reloading() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  // systemd's notify-reload wants the moment the reload began, to tell it from an older one.
  socket_.send(
      "RELOADING=1\nMONOTONIC_USEC=" +
      std::to_string(static_cast<unsigned long long>(now.tv_sec) * 1000000 + now.tv_nsec / 1000));
}

void ServiceNotifier::stopping() {
  socket_.send("STOPPING=1");
  watchdog_timer_.cancel();
  status_timer_.cancel();
}

void ServiceNotifier::ping() {
  socket_.send("WATCHDOG=1");
  watchdog_timer_.expires_after(*watchdog_);
  watchdog_timer_.async_wait([this](boost::system::error_code ec) {
    if (!ec) ping();
  });
}

void ServiceNotifier::refresh_status() {
  status_timer_.expires_after(kStatusInterval);
  status_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    if (std::string status = status_(); status != sent_status_ && socket_.send("STATUS=" + status))
      sent_status_ = std::move(status);
    refresh_status();
  });
}

}  // namespace mcprun
