// SystemDoctorProbes: what mcprun doctor asks of the real system (sockets, routes, clocks, torch).
#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/messages.hpp"
#include "common/proc_sockets.hpp"
#include "common/protocol.hpp"
#include "common/sys.hpp"
#include "common/unique_fd.hpp"
#include "launcher/commands/doctor.hpp"
#include "launcher/plan/rank_plan.hpp"
#include "launcher/plan/worker_env.hpp"
#include "launcher/process/deadline.hpp"
#include "launcher/process/process_control.hpp"

namespace mcprun {
namespace fs = std::filesystem;

namespace {

/// A socket address for a numeric IPv4/IPv6 `address` and `port`; nullopt if it is not numeric.
std::optional<std::pair<sockaddr_storage, socklen_t>> numeric_sockaddr(const std::string& address,
                                                                       int port) {
  sockaddr_storage storage{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
  if (::inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    return std::pair(storage, static_cast<socklen_t>(sizeof(sockaddr_in)));
  }
  storage = {};
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
  if (::inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    return std::pair(storage, static_cast<socklen_t>(sizeof(sockaddr_in6)));
  }
  return std::nullopt;
}

std::string address_text(const sockaddr_storage& storage) {
  char text[INET6_ADDRSTRLEN] = {};
  if (storage.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, text,
                sizeof text);
  else if (storage.ss_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, text,
                sizeof text);
  return text;
}

/// A connected socket to `endpoint`, or how the attempt ended; waits at most `limit`.
std::variant<UniqueFd, ConnectResult> open_connection(DoctorProbes& probes,
                                                      const Endpoint& endpoint,
                                                      std::chrono::milliseconds limit) {
  using Outcome = ConnectResult::Outcome;
  sockaddr_storage storage{};
  socklen_t length = 0;
  if (endpoint.is_unix()) {
    auto* address = reinterpret_cast<sockaddr_un*>(&storage);
    if (endpoint.unix_path.size() >= sizeof address->sun_path)
      return ConnectResult{Outcome::kUnreachable, "socket path too long"};
    address->sun_family = AF_UNIX;
    std::memcpy(address->sun_path, endpoint.unix_path.c_str(), endpoint.unix_path.size() + 1);
    length = sizeof(sockaddr_un);
  } else {
    std::string host = endpoint.host;
    if (!numeric_sockaddr(host, endpoint.port)) {
      auto addresses = probes.resolve(host);
      if (!addresses) return ConnectResult{Outcome::kUnreachable, addresses.error().message};
      if (addresses->empty()) return ConnectResult{Outcome::kUnreachable, host + " has no address"};
      host = addresses->front();
    }
    auto numeric = numeric_sockaddr(host, endpoint.port);
    if (!numeric) return ConnectResult{Outcome::kUnreachable, "not an address: " + host};
    std::tie(storage, length) = *numeric;
  }
  UniqueFd fd(::socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid())
    return ConnectResult{Outcome::kUnreachable, std::string("socket: ") + std::strerror(errno)};
  int error = 0;
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&storage), length) != 0) {
    error = errno;
    if (error == EINPROGRESS) {
      if (!wait_for_fd(fd.get(), POLLOUT, limit)) return ConnectResult{Outcome::kTimedOut, ""};
      socklen_t size = sizeof error;
      if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &size) != 0) error = errno;
    }
  }
  if (error == 0) {
    // Back to blocking: the clock exchange polls with its own deadline.
    ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
    return fd;
  }
  // A missing unix socket is "nothing listens there", as a refused TCP port is.
  if (error == ECONNREFUSED || (endpoint.is_unix() && error == ENOENT))
    return ConnectResult{Outcome::kRefused, std::strerror(error)};
  if (error == ETIMEDOUT) return ConnectResult{Outcome::kTimedOut, ""};
  return ConnectResult{Outcome::kUnreachable, std::strerror(error)};
}

/// Reads one frame from `fd` by `deadline`; an error line otherwise.
Expected<nlohmann::json> read_frame(int fd, std::chrono::steady_clock::time_point deadline) {
  std::string buffer;
  char chunk[4096];
  for (;;) {
    FrameResult frame = decode_frame(buffer);
    if (auto* done = std::get_if<Frame>(&frame)) return std::move(done->message);
    if (auto* error = std::get_if<FrameError>(&frame))
      return Error{"what answers there is not a rendezvousd (" + error->message + ")"};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || !wait_for_fd(fd, POLLIN, left))
      return Error{"no reply within " + seconds_text(kClockReplyTimeout) + " s"};
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n == 0) return Error{"the connection closed without a reply"};
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error{std::string("recv: ") + std::strerror(errno)};
    }
    buffer.append(chunk, static_cast<size_t>(n));
  }
}

int64_t unix_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Expected<FilesystemSpace> SystemDoctorProbes::filesystem_space(const fs::path& path) {
  struct statvfs stats {};
  if (::statvfs(path.c_str(), &stats) != 0)
    return Error{"statvfs(" + path.string() + "): " + std::strerror(errno)};
  return FilesystemSpace{static_cast<uint64_t>(stats.f_blocks) * stats.f_frsize,
                         static_cast<uint64_t>(stats.f_bavail) * stats.f_frsize};
}

Expected<std::vector<std::string>> SystemDoctorProbes::resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (error != 0) return Error{::gai_strerror(error)};
  std::vector<std::string> v4, v6;
  for (addrinfo* entry = found; entry; entry = entry->ai_next) {
    sockaddr_storage storage{};
    std::memcpy(&storage, entry->ai_addr, std::min<size_t>(entry->ai_addrlen, sizeof storage));
    auto& list = entry->ai_family == AF_INET ? v4 : v6;
    const std::string text = address_text(storage);
    if (!text.empty() && std::find(list.begin(), list.end(), text) == list.end())
      list.push_back(text);
  }
  ::freeaddrinfo(found);
  // mcprun's store listens on IPv4: that is the address peers use when there is one.
  v4.insert(v4.end(), v6.begin(), v6.end());
  return v4;
}

std::optional<std::string> SystemDoctorProbes::source_address(const std::string& address) {
  // Any port does: a UDP connect only picks the route and sends nothing.
  constexpr int kProbePort = 9;
  auto target = numeric_sockaddr(address, kProbePort);
  if (!target) return std::nullopt;
  UniqueFd fd(::socket(target->first.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid() ||
      ::connect(fd.get(), reinterpret_cast<sockaddr*>(&target->first), target->second) != 0)
    return std::nullopt;
  sockaddr_storage local{};
  socklen_t length = sizeof local;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &length) != 0)
    return std::nullopt;
  return address_text(local);
}

std::optional<std::string> SystemDoctorProbes::interface_of(const std::string& local_address) {
  return interface_for_address(local_address);
}

std::vector<std::string> SystemDoctorProbes::interface_names() {
  std::vector<std::string> names;
  if (struct if_nameindex* list = ::if_nameindex()) {
    for (struct if_nameindex* entry = list; entry->if_index != 0; ++entry)
      names.emplace_back(entry->if_name);
    ::if_freenameindex(list);
  }
  return names;
}

int SystemDoctorProbes::bind_error(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(port));
  // No SO_REUSEADDR: any socket bound to the port, listening or reserved, makes this fail.
  return ::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 ? 0 : errno;
}

std::optional<std::string> SystemDoctorProbes::listener_on(int port) {
  auto listener = listener_on_port(port);
  if (!listener) return std::nullopt;
  if (!listener->pid) return std::string();
  return "pid " + std::to_string(*listener->pid) + " (" + listener->command + ")";
}

ConnectResult SystemDoctorProbes::connect(const Endpoint& endpoint,
                                          std::chrono::milliseconds limit) {
  auto connection = open_connection(*this, endpoint, limit);
  if (auto* result = std::get_if<ConnectResult>(&connection)) return *result;
  return ConnectResult{ConnectResult::Outcome::kConnected, ""};
}

Expected<ClockReading> SystemDoctorProbes::read_clock(const Endpoint& endpoint) {
  const std::string request = encode_frame(encode(ClockRequest{}));
  std::optional<ClockReading> best;
  // One connection per sample: the daemon answers a connection that has not joined once.
  for (int sample = 0; sample < kClockSamples; ++sample) {
    auto connection = open_connection(*this, endpoint, kDoctorConnectTimeout);
    if (auto* result = std::get_if<ConnectResult>(&connection)) {
      switch (result->outcome) {
        case ConnectResult::Outcome::kRefused:
          return Error{"nothing listens at " + endpoint.text()};
        case ConnectResult::Outcome::kTimedOut:
          return Error{endpoint.text() + " did not answer"};
        default:
          return Error{"cannot reach " + endpoint.text() + ": " + result->error};
      }
    }
    const UniqueFd fd = std::move(std::get<UniqueFd>(connection));
    // Timed from the request, not the connect: the handshake is not part of the exchange.
    const auto sent = std::chrono::steady_clock::now();
    const int64_t sent_unix_ns = unix_now_ns();
    if (::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(request.size()))
      return Error{std::string("send: ") + std::strerror(errno)};
    auto reply = read_frame(fd.get(), sent + kClockReplyTimeout);
    const auto rtt = std::chrono::steady_clock::now() - sent;
    if (!reply) return reply.error();
    auto decoded = decode_rendezvous_message(*reply);
    if (decoded)
      if (const auto* refused = std::get_if<ErrorMessage>(&*decoded))
        return Error{"the rendezvous refused 'clock': " + refused->message +
                     " (a rendezvousd older than this mcprun?)"};
    const auto* remote = decoded ? std::get_if<ClockReply>(&*decoded) : nullptr;
    if (!remote)
      return Error{"the rendezvous answered 'clock' with " +
                   (decoded ? "'" + message_type(*reply) + "'" : decoded.error().message)};
    // The daemon read its clock, at best guess, halfway through the round trip.
    const int64_t midpoint_ns =
        sent_unix_ns + std::chrono::duration_cast<std::chrono::nanoseconds>(rtt).count() / 2;
    ClockReading reading{std::chrono::nanoseconds(remote->unix_time_ns - midpoint_ns),
                         std::chrono::duration_cast<std::chrono::nanoseconds>(rtt)};
    if (!best || reading.rtt < best->rtt) best = reading;
  }
  return *best;
}

namespace {

/// Asks torch, in the workers' interpreter, which NCCL it runs and which it ships with.
constexpr const char* kTorchNcclScript = R"PY(
import json
try:
    import torch
except Exception as error:
    print(json.dumps({"error": "cannot import torch: %s" % error}))
    raise SystemExit
found = {"torch": torch.__version__, "cuda": torch.version.cuda or ""}
if found["cuda"]:
    try:
        code = torch.cuda.nccl.version()
        if isinstance(code, int):  # torch 1.x: 2708 is 2.7.8, 21805 is 2.18.5
            code = (code // 10000, code // 100 % 100, code % 100) if code >= 10000 else (code // 1000, code // 100 % 10, code % 100)
        found["loaded"] = ".".join(str(part) for part in code[:3])
    except Exception as error:
        found["load_error"] = str(error)
    with open("/proc/self/maps") as maps:
        found["libraries"] = sorted({line.split()[-1] for line in maps if "libnccl" in line})
    from importlib import metadata
    for package in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        try:
            found["shipped"] = metadata.version(package)
            break
        except Exception:
            pass
print(json.dumps(found))
)PY";

}  // namespace

Expected<TorchNccl> SystemDoctorProbes::torch_nccl(const std::string& python,
                                                   const Environment& env) {
  auto resolved = find_executable(python, search_path_of(env));
  if (!resolved) return Error{python + " not found"};
  PosixProcessControl control;
  auto run =
      run_with_deadline(control, {*resolved, "-c", kTorchNcclScript}, merge_environment(env, {}),
                        kTorchProbeTimeout, kTorchProbeExitTimeout);
  if (!run) return run.error();
  if (run->timed_out)
    return Error{"no answer within " + std::to_string(kTorchProbeTimeout.count()) + " s"};
  const std::string& output = run->output;
  try {
    const auto found = nlohmann::json::parse(output);
    if (found.contains("error")) return Error{found["error"].get<std::string>()};
    return TorchNccl{found.at("torch"),
                     found.at("cuda"),
                     found.value("loaded", ""),
                     found.value("load_error", ""),
                     found.value("libraries", std::vector<std::string>{}),
                     found.value("shipped", "")};
  } catch (const nlohmann::json::exception&) {
    return Error{*resolved + " printed no answer (" +
                 (output.empty() ? "nothing" : output.substr(0, 200)) + ")"};
  }
}

}  // namespace mcprun
