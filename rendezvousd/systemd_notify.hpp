// systemd's notify protocol, spoken directly (it is one datagram; no libsystemd): readiness,
// reloads, shutdown, a status line and watchdog pings for a Type=notify unit.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "common/unique_fd.hpp"

namespace mcprun {

/// How often the status line is looked at; systemd hears of it only when it changed.
inline constexpr std::chrono::seconds kStatusInterval{1};

/// The socket systemd listens on for a unit's notifications ($NOTIFY_SOCKET).
class NotifySocket {
 public:
  /// `address`: a path, or "@name" for an abstract socket; empty: disabled, every send a no-op.
  /// An address that cannot be used (relative, too long, another family) disables it with one
  /// warning.
  explicit NotifySocket(std::string_view address);
  /// From $NOTIFY_SOCKET: disabled when unset, as outside a Type=notify unit.
  static NotifySocket from_environment();

  bool enabled() const { return fd_.valid(); }
  /// Sends one datagram of newline-separated assignments ("READY=1\nSTATUS=..."). Never blocks:
  /// a full queue drops it. False when disabled or the send failed.
  bool send(std::string_view assignments) const;

 private:
  UniqueFd fd_;
  sockaddr_un address_{};
  socklen_t address_length_ = 0;
};

/// How often to send WATCHDOG=1: half of `watchdog_usec` ($WATCHDOG_USEC), when it is set, and
/// meant for `self` (`watchdog_pid`, $WATCHDOG_PID, unset or equal); nullopt: no watchdog.
std::optional<std::chrono::microseconds> watchdog_interval(const char* watchdog_usec,
                                                           const char* watchdog_pid, pid_t self);

/// The daemon's side of its unit: READY/RELOADING/STOPPING, a STATUS line kept current, and
/// WATCHDOG=1 from the event loop itself, so a wedged loop stops the pings and systemd restarts it.
class ServiceNotifier {
 public:
  /// `status` describes the daemon in one line; it is called on the loop every kStatusInterval.
  ServiceNotifier(boost::asio::io_context& io, NotifySocket socket,
                  std::optional<std::chrono::microseconds> watchdog,
                  std::function<std::string()> status);
  /// READY=1 with the status: once listening, and again after each reload. Starts the pings.
  void ready();
  /// RELOADING=1: a reload begins; ready() ends it.
  void reloading();
  /// STOPPING=1; stops the pings and the status updates, so the loop can run out of work.
  void stopping();

 private:
  void ping();
  void refresh_status();

  NotifySocket socket_;
  std::optional<std::chrono::microseconds> watchdog_;
  std::function<std::string()> status_;
  std::string sent_status_;
  boost::asio::steady_timer watchdog_timer_, status_timer_;
  bool started_ = false;
};

}  // namespace mcprun
