#include "common/proc_sockets.hpp"

#include <arpa/inet.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace mcprun {
namespace {

namespace fs = std::filesystem;

constexpr const char* kEstablished = "01";
constexpr const char* kListening = "0A";

/// Every process this user can see in /proc.
std::vector<pid_t> process_ids() {
  std::vector<pid_t> pids;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename();
    if (!name.empty() && name.find_first_not_of("0123456789") == std::string::npos)
      pids.push_back(std::stoi(name));
  }
  return pids;
}

/// The pids of `leader`'s process group, the leader first.
std::vector<pid_t> group_members(pid_t leader) {
  std::vector<pid_t> members{leader};
  for (pid_t pid : process_ids()) {
    if (pid == leader) continue;
    std::ifstream stat(fs::path("/proc") / std::to_string(pid) / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // Fields after the parenthesised command: state ppid pgrp ...
    std::istringstream rest(line.substr(line.rfind(')') + 1));
    std::string state;
    pid_t ppid = 0, pgrp = 0;
    if (rest >> state >> ppid >> pgrp && pgrp == leader) members.push_back(pid);
  }
  return members;
}

/// The inodes of `pid`'s open sockets; empty when its descriptors are hidden from this user.
std::set<unsigned long> socket_inodes(pid_t pid) {
  std::set<unsigned long> inodes;
  std::error_code ec;
  for (const auto& fd :
       fs::directory_iterator(fs::path("/proc") / std::to_string(pid) / "fd", ec)) {
    const std::string target = fs::read_symlink(fd.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) inodes.insert(std::stoul(target.substr(8)));
  }
  return inodes;
}

/// Decodes /proc/net/tcp{,6}'s "0100007F:1F90": the address as the kernel stores it in memory.
SocketEnd decode_end(const std::string& text) {
  const auto colon = text.find(':');
  const std::string hex = text.substr(0, colon);
  SocketEnd end{"", std::stoi(text.substr(colon + 1), nullptr, 16)};
  unsigned char bytes[16];
  for (size_t i = 0; i < hex.size() / 8; ++i) {
    const uint32_t word = static_cast<uint32_t>(std::stoul(hex.substr(i * 8, 8), nullptr, 16));
    std::memcpy(bytes + i * 4, &word, 4);  // Host-order words, as the kernel printed them.
  }
  char buffer[INET6_ADDRSTRLEN] = {};
  if (hex.size() == 8) {
    ::inet_ntop(AF_INET, bytes, buffer, sizeof buffer);
  } else {
    static const unsigned char kV4Mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(bytes, kV4Mapped, 12) == 0)
      ::inet_ntop(AF_INET, bytes + 12, buffer, sizeof buffer);
    else
      ::inet_ntop(AF_INET6, bytes, buffer, sizeof buffer);
  }
  end.address = buffer;
  return end;
}

/// One row of /proc/.../net/tcp{,6}.
struct TcpSocket {
  SocketEnd local, remote;
  std::string state;  ///< The kernel's hex code: kEstablished, kListening, ...
  unsigned long inode = 0;
  uint64_t send_queue = 0;
};

/// Every TCP socket of the network namespace `net_dir` (/proc/PID/net) shows, IPv4 and IPv6.
std::vector<TcpSocket> tcp_sockets(const fs::path& net_dir) {
  std::vector<TcpSocket> sockets;
  for (const char* table : {"tcp", "tcp6"}) {
    std::ifstream in(net_dir / table);
    std::string line;
    std::getline(in, line);  // Header.
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout;
      unsigned long inode = 0;
      if (!(fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
            timeout >> inode))
        continue;
      // "tx_queue:rx_queue" in hex.
      sockets.push_back({decode_end(local), decode_end(remote), state, inode,
                         std::stoull(queues.substr(0, queues.find(':')), nullptr, 16)});
    }
  }
  return sockets;
}

}  // namespace

std::vector<SocketEnd> connections_to_port(pid_t pid, int remote_port) {
  std::set<unsigned long> inodes;
  for (pid_t member : group_members(pid)) inodes.merge(socket_inodes(member));
  std::vector<SocketEnd> ends;
  if (inodes.empty()) return ends;
  // The worker's own view: it may live in another network namespace than ours.
  for (const TcpSocket& socket : tcp_sockets(fs::path("/proc") / std::to_string(pid) / "net"))
    if (socket.state == kEstablished && inodes.contains(socket.inode) &&
        socket.remote.port == remote_port)
      ends.push_back(socket.local);
  return ends;
}

std::vector<QueuedConnection> send_queues(pid_t pid) {
  std::vector<QueuedConnection> connections;
  const std::set<unsigned long> inodes = socket_inodes(pid);
  if (inodes.empty()) return connections;
  for (const TcpSocket& socket : tcp_sockets(fs::path("/proc") / std::to_string(pid) / "net"))
    if (socket.state == kEstablished && inodes.contains(socket.inode))
      connections.push_back({socket.local, socket.remote, socket.send_queue});
  return connections;
}

std::optional<PortListener> listener_on_port(int port) {
  std::set<unsigned long> listening;
  for (const TcpSocket& socket : tcp_sockets("/proc/self/net"))
    if (socket.state == kListening && socket.local.port == port) listening.insert(socket.inode);
  if (listening.empty()) return std::nullopt;
  for (pid_t pid : process_ids()) {
    for (unsigned long inode : socket_inodes(pid)) {
      if (!listening.contains(inode)) continue;
      std::string command;
      std::getline(std::ifstream(fs::path("/proc") / std::to_string(pid) / "comm"), command);
      return PortListener{pid, command};
    }
  }
  return PortListener{};
}

}  // namespace mcprun
