#include "rendezvousd/systemd_notify.hpp"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <string>

#include "common/event_loop.hpp"

namespace mcprun {
namespace {

using namespace std::chrono_literals;

/// A unix datagram socket standing in for systemd's notify socket.
class NotifyListener {
 public:
  /// `address`: a path, or "@name" for the abstract namespace.
  explicit NotifyListener(std::string address) : address_(std::move(address)) {
    fd_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, address_.data(), address_.size());
    const bool abstract = address_.front() == '@';
    if (abstract) addr.sun_path[0] = '\0';
    const auto length =
        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address_.size() + !abstract);
    EXPECT_EQ(::bind(fd_.get(), reinterpret_cast<sockaddr*>(&addr), length), 0)
        << std::strerror(errno);
  }
  ~NotifyListener() {
    if (address_.front() == '/') ::unlink(address_.c_str());
  }
  const std::string& address() const { return address_; }

  /// The next datagram, or "" when none arrives within `limit`.
  std::string receive(std::chrono::milliseconds limit = 2s) {
    pollfd ready{fd_.get(), POLLIN, 0};
    if (::poll(&ready, 1, static_cast<int>(limit.count())) != 1) return "";
    char buffer[4096];
    const ssize_t n = ::recv(fd_.get(), buffer, sizeof buffer, 0);
    return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
  }

 private:
  std::string address_;
  UniqueFd fd_;
};

std::string temp_socket_path() {
  return (std::filesystem::temp_directory_path() /
          ("notify-test-" + std::to_string(::getpid()) + ".sock"))
      .string();
}

TEST(NotifySocket, SendsOneDatagramToAPath) {
  NotifyListener listener(temp_socket_path());
  NotifySocket socket(listener.address());
  ASSERT_TRUE(socket.enabled());
  EXPECT_TRUE(socket.send("READY=1\nSTATUS=up"));
  EXPECT_EQ(listener.receive(), "READY=1\nSTATUS=up");
}

TEST(NotifySocket, ReachesAnAbstractName) {
  NotifyListener listener("@mcprun-notify-test-" + std::to_string(::getpid()));
  NotifySocket socket(listener.address());
  EXPECT_TRUE(socket.send("WATCHDOG=1"));
  EXPECT_EQ(listener.receive(), "WATCHDOG=1");
}

TEST(NotifySocket, IsANoOpWhenUnsetOrUnusable) {
  ::unsetenv("NOTIFY_SOCKET");
  EXPECT_FALSE(NotifySocket::from_environment().enabled());
  EXPECT_FALSE(NotifySocket("").send("READY=1"));
  EXPECT_FALSE(NotifySocket("relative/path").enabled());
  EXPECT_FALSE(NotifySocket("vsock:2:1234").enabled());
  EXPECT_FALSE(NotifySocket("/" + std::string(200, 'x')).enabled());
  // Nobody listening: the send fails and nothing blocks.
  NotifySocket nobody(temp_socket_path() + ".absent");
  EXPECT_TRUE(nobody.enabled());
  EXPECT_FALSE(nobody.send("READY=1"));
}

TEST(NotifySocket, FromEnvironmentReadsNotifySocket) {
  NotifyListener listener(temp_socket_path());
  ::setenv("NOTIFY_SOCKET", listener.address().c_str(), 1);
  NotifySocket socket = NotifySocket::from_environment();
  ::unsetenv("NOTIFY_SOCKET");
  EXPECT_TRUE(socket.send("READY=1"));
  EXPECT_EQ(listener.receive(), "READY=1");
}

TEST(WatchdogInterval, IsHalfOfWatchdogUsecWhenMeantForUs) {
  const pid_t self = ::getpid();
  EXPECT_EQ(watchdog_interval("30000000", nullptr, self), std::chrono::microseconds(15000000));
  EXPECT_EQ(watchdog_interval("30000000", "", self), std::chrono::microseconds(15000000));
  EXPECT_EQ(watchdog_interval("400000", std::to_string(self).c_str(), self),
            std::chrono::microseconds(200000));
  EXPECT_EQ(watchdog_interval("400000", std::to_string(self + 1).c_str(), self), std::nullopt);
  EXPECT_EQ(watchdog_interval(nullptr, nullptr, self), std::nullopt);
  EXPECT_EQ(watchdog_interval("0", nullptr, self), std::nullopt);
  EXPECT_EQ(watchdog_interval("soon", nullptr, self), std::nullopt);
  EXPECT_EQ(watchdog_interval("100x", nullptr, self), std::nullopt);
}

TEST(ServiceNotifier, ReadyPingsStatusAndStopping) {
  NotifyListener listener(temp_socket_path());
  boost::asio::io_context io;
  std::string status = "jobs: 0 running";
  ServiceNotifier notifier(io, NotifySocket(listener.address()), std::chrono::milliseconds(100),
                           [&] { return status; });
  notifier.ready();
  EXPECT_EQ(listener.receive(), "READY=1\nSTATUS=jobs: 0 running");
  EXPECT_EQ(listener.receive(), "WATCHDOG=1");  // The first ping goes out with readiness.

  // Pings keep coming while the loop runs; the status is sent once when it changes, not again.
  status = "jobs: 1 running";
  int pings = 0, statuses = 0;
  const auto until = std::chrono::steady_clock::now() + kStatusInterval + 500ms;
  run_until(
      io,
      [&] {
        for (std::string got = listener.receive(0ms); !got.empty(); got = listener.receive(0ms)) {
          pings += got == "WATCHDOG=1";
          statuses += got == "STATUS=jobs: 1 running";
        }
        return std::chrono::steady_clock::now() >= until;
      },
      kStatusInterval + 1s);
  EXPECT_GE(pings, 8);
  EXPECT_EQ(statuses, 1);

  notifier.reloading();
  EXPECT_EQ(listener.receive().rfind("RELOADING=1\nMONOTONIC_USEC=", 0), 0u);
  notifier.ready();
  EXPECT_EQ(listener.receive(), "READY=1\nSTATUS=jobs: 1 running");

  notifier.stopping();
  EXPECT_EQ(listener.receive(), "STOPPING=1");
  // Nothing is left on the loop: it runs out of work at once.
  const auto started = std::chrono::steady_clock::now();
  io.restart();
  io.run_for(2s);
  EXPECT_TRUE(io.stopped());
  EXPECT_LT(std::chrono::steady_clock::now() - started, 1s);
}

TEST(ServiceNotifier, WithoutNotifySocketDoesNothing) {
  boost::asio::io_context io;
  bool asked = false;
  ServiceNotifier notifier(io, NotifySocket(""), std::chrono::milliseconds(10), [&] {
    asked = true;
    return std::string();
  });
  notifier.ready();
  io.run_for(100ms);
  EXPECT_TRUE(io.stopped());  // No timers were armed.
  EXPECT_FALSE(asked);
}

}  // namespace
}  // namespace mcprun
