// The doctor's network checks: the interface NCCL and gloo would use, the master port, the
// rendezvous endpoint, the host name and the clocks. The others are in doctor_checks.cpp.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/exit_status.hpp"
#include "common/sys.hpp"
#include "common/topology.hpp"
#include "launcher/commands/doctor.hpp"
#include "launcher/commands/doctor_findings.hpp"
#include "launcher/config/slurm.hpp"

namespace mcprun {
namespace fs = std::filesystem;
using namespace doctor_findings;
namespace {

bool is_loopback(const std::string& address) {
  in_addr v4{};
  if (::inet_pton(AF_INET, address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, address.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return address == "localhost";
}

/// An address of this node: loopback, or held by one of its interfaces.
bool is_local(const std::string& address, DoctorProbes& probes) {
  return is_loopback(address) || probes.interface_of(address).has_value();
}

/// The master or the rendezvous host, as the other checks name and reach it.
struct RouteTarget {
  std::string host;
  std::string label;  ///< "MASTER_ADDR 10.0.0.1", "the rendezvous host head".
};

std::optional<RouteTarget> route_target(const DoctorInputs& inputs) {
  if (!inputs.rdzv_endpoint.empty()) {
    auto endpoint = parse_endpoint(inputs.rdzv_endpoint, kConnectRules);
    if (endpoint && !endpoint->is_unix())
      return RouteTarget{endpoint->host, "the rendezvous host " + endpoint->host};
  }
  if (!inputs.master_addr.empty())
    return RouteTarget{inputs.master_addr, "MASTER_ADDR " + inputs.master_addr};
  return std::nullopt;
}

std::string describe_connect_error(const ConnectResult& result) {
  return result.error.empty() ? "unreachable" : result.error;
}

/// "2.314 s", "12.0 ms", "0.04 ms": enough digits to tell a loopback round trip from zero.
std::string describe_duration(std::chrono::nanoseconds duration) {
  const double ms = std::abs(std::chrono::duration<double, std::milli>(duration).count());
  char text[32];
  if (ms >= 1000)
    std::snprintf(text, sizeof text, "%.3f s", ms / 1000);
  else
    std::snprintf(text, sizeof text, ms >= 10 ? "%.1f ms" : "%.2f ms", ms);
  return text;
}

/// The skew with its direction: "2.314 s behind", "12.0 ms ahead of".
std::string describe_skew(std::chrono::nanoseconds skew) {
  // Positive skew: the rendezvous reads later than we do, so this node is behind.
  return describe_duration(skew) + (skew.count() >= 0 ? " behind" : " ahead of");
}

}  // namespace

CheckResult check_interface(const DoctorInputs& inputs, DoctorProbes& probes) {
  auto target = route_target(inputs);
  if (!target) {
    if (!inputs.rdzv_endpoint.empty())
      return ok("interface", "the rendezvous is a unix socket on this host: nothing to route");
    return ok("interface",
              "no --master-addr, MASTER_ADDR or --rdzv-endpoint given: a single-node job talks "
              "over loopback (give the master's address to check the route to it)");
  }
  const FirstAddress address = first_address(target->host, probes);
  if (!address.error.empty())
    return fail("interface", "cannot resolve " + target->label + ": " + address.error,
                "fix the name (DNS or /etc/hosts) or pass the address as a number");
  const std::string& to = address.address;
  const std::string where = target->label + (to == target->host ? "" : " (" + to + ")");
  if (is_loopback(to))
    return ok("interface", where +
                               " is loopback: right for a single-node job only; other nodes "
                               "cannot reach it");
  auto source = probes.source_address(to);
  if (!source)
    return fail("interface", "no route to " + where,
                "check the address and the routing table (ip route get " + to + ")");
  auto interface = probes.interface_of(*source);
  if (!interface)
    return warn("interface",
                "the route to " + where + " leaves from " + *source + ", which no interface holds",
                "check ip route get " + to + " and ip -br addr");
  // The master is this node: peers reach it on the interface that holds the address.
  const std::string route = *source == to
                                ? where + " is this node's address on " + *interface
                                : "the route to " + where + " leaves through " + *interface +
                                      " (" + *source + ")";
  const std::string set_names =
      "set NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME to the interface that reaches the other "
      "nodes (mcprun sets both itself for a multi-node c10d job)";
  if (*interface == "lo")
    return warn("interface", route + ": loopback, which other nodes cannot reach", set_names);
  if (interface->starts_with("docker") || interface->starts_with("virbr") ||
      interface->starts_with("br-"))
    return warn("interface",
                route +
                    ", a container/VM bridge: other hosts rarely reach it, and NCCL skips "
                    "docker* and lo by default, so NCCL and Gloo may take different interfaces",
                set_names + ", or fix the route");
  auto nccl = inputs.env.find("NCCL_SOCKET_IFNAME");
  if (nccl != inputs.env.end() && !nccl_interface_matches(nccl->second, *interface))
    return warn("interface", route + ", but NCCL_SOCKET_IFNAME=" + nccl->second + " excludes it",
                "set NCCL_SOCKET_IFNAME=" + *interface + " (and GLOO_SOCKET_IFNAME), or unset it");
  auto gloo = inputs.env.find("GLOO_SOCKET_IFNAME");
  if (gloo != inputs.env.end() && split(gloo->second, ',') != std::vector<std::string>{*interface})
    return warn("interface", route + ", but GLOO_SOCKET_IFNAME=" + gloo->second,
                "set GLOO_SOCKET_IFNAME=" + *interface + " (and NCCL_SOCKET_IFNAME), or unset it");
  return ok("interface", route);
}

std::vector<CheckResult> check_master_port(const DoctorInputs& inputs, DoctorProbes& probes) {
  const std::string name = "master-port";
  if (inputs.master_port.empty()) {
    if (inputs.master_addr.empty()) return {};
    return {ok(name,
               "no MASTER_PORT given: mcprun reserves a free one on the master (29500 for "
               "a static multi-node job)")};
  }
  auto port = parse_port(inputs.master_port);
  if (!port)
    return {fail(name, "MASTER_PORT '" + inputs.master_port + "' is not a port (1-65535)",
                 "set a number from 1 to 65535, or leave it out: mcprun reserves a free one")};
  // mcprun's own default: a master on loopback.
  const std::string host = inputs.master_addr.empty() ? "127.0.0.1" : inputs.master_addr;
  const FirstAddress address = first_address(host, probes);
  if (!address.error.empty())
    return {warn(name, "not checked: " + host + " does not resolve (see the interface check)",
                 "fix the master's name first")};
  const std::string& to = address.address;
  const std::string at = to + ":" + std::to_string(*port);
  if (is_local(to, probes)) {
    const int error = probes.bind_error(*port);
    if (error == 0)
      return {
          ok(name, "MASTER_PORT " + std::to_string(*port) + " is free on this node (the master)")};
    if (error == EADDRINUSE) {
      if (auto owner = probes.listener_on(*port))
        return {fail(
            name,
            "MASTER_PORT " + std::to_string(*port) + " is taken here: " +
                (owner->empty() ? "something listens on it (its owner is hidden from this user)"
                                : *owner + " listens on it"),
            "the job store cannot listen there: stop that process (a leftover job's "
            "store?), or pick another --master-port, or leave it out: mcprun reserves a free one")};
      return {warn(name,
                   "MASTER_PORT " + std::to_string(*port) +
                       " is bound here but nothing listens: a port "
                       "another job reserved (mcprun keeps its MASTER_PORT bound), or connections "
                       "lingering in TIME_WAIT",
                   "wait for the other job to end, or pick another --master-port")};
    }
    if (error == EACCES)
      return {fail(
          name, "MASTER_PORT " + std::to_string(*port) + " needs privileges to bind (below 1024)",
          "pick a port above 1023")};
    return {
        warn(name,
             "cannot test MASTER_PORT " + std::to_string(*port) + ": bind: " + std::strerror(error),
             "check it by hand: ss -ltnp 'sport = :" + std::to_string(*port) + "'")};
  }
  const ConnectResult result = probes.connect(Endpoint{to, *port, ""}, kDoctorConnectTimeout);
  switch (result.outcome) {
    case ConnectResult::Outcome::kConnected:
      return {
          ok(name, "something already listens at " + at +
                       ": the master's job store if its job runs, else the port is taken there")};
    case ConnectResult::Outcome::kRefused:
      return {ok(name, to + " is reachable and nothing listens on " + std::to_string(*port) +
                           " yet: right before the job starts")};
    case ConnectResult::Outcome::kTimedOut:
      return {warn(name,
                   at + " did not answer within " + seconds_text(kDoctorConnectTimeout) +
                       " s: packets dropped (a firewall?)",
                   "allow TCP between the nodes on this port and on the ephemeral ports NCCL and "
                   "Gloo open (firewalld/ufw/iptables, the cloud's security groups)")};
    case ConnectResult::Outcome::kUnreachable:
      break;
  }
  return {fail(name, "cannot reach " + at + ": " + describe_connect_error(result),
               "check the address and the routing table (ip route get " + to + ")")};
}

std::vector<CheckResult> check_rdzv_endpoint(const DoctorInputs& inputs, DoctorProbes& probes) {
  const std::string name = "rdzv-endpoint";
  if (inputs.rdzv_endpoint.empty()) return {};
  auto parsed = parse_endpoint(inputs.rdzv_endpoint, kConnectRules);
  if (!parsed)
    return {
        fail(name, "--rdzv-endpoint " + parsed.error().message, "expected HOST:PORT or unix:PATH")};
  Endpoint endpoint = *parsed;
  const std::string shown = endpoint.text();
  const std::string start_it =
      "start rendezvousd there (rendezvousd --listen 0.0.0.0:" + std::to_string(endpoint.port) +
      "), or start mcprun on that node first: it hosts the rendezvous itself";
  const std::string timeout_text = " did not answer within " + seconds_text(kDoctorConnectTimeout) +
                                   " s: packets dropped (a firewall?)";
  const std::string firewall =
      "allow TCP to port " + std::to_string(endpoint.port) +
      " from every node (firewalld/ufw/iptables, the cloud's security groups)";
  if (endpoint.is_unix()) {
    const ConnectResult result = probes.connect(endpoint, kDoctorConnectTimeout);
    if (result.outcome == ConnectResult::Outcome::kConnected)
      return {ok(name, "something listens at " + shown)};
    return {fail(name, "nothing listens at " + shown + ": " + describe_connect_error(result),
                 "start rendezvousd --unix-socket " + endpoint.unix_path)};
  }
  const FirstAddress address = first_address(endpoint.host, probes);
  if (!address.error.empty())
    return {warn(name,
                 "not checked: " + endpoint.host + " does not resolve (see the interface check)",
                 "fix the rendezvous host's name first")};
  const bool local = is_local(address.address, probes);
  endpoint.host = address.address;
  const ConnectResult result = probes.connect(endpoint, kDoctorConnectTimeout);
  switch (result.outcome) {
    case ConnectResult::Outcome::kConnected:
      return {ok(name, "something listens at " + shown +
                           " (rendezvousd, or a node hosting the rendezvous)")};
    case ConnectResult::Outcome::kRefused:
      if (local)
        return {
            ok(name,
               "nothing listens at " + shown +
                   " yet: the endpoint is this node, so mcprun will host the rendezvous itself")};
      return {fail(name,
                   endpoint.host + " is reachable but nothing listens on port " +
                       std::to_string(endpoint.port),
                   start_it)};
    case ConnectResult::Outcome::kTimedOut:
      return {fail(name, shown + timeout_text, firewall)};
    case ConnectResult::Outcome::kUnreachable:
      break;
  }
  return {fail(name, "cannot reach " + shown + ": " + describe_connect_error(result),
               "check the address and the routing table (ip route get " + endpoint.host + ")")};
}

CheckResult check_hostname(const DoctorInputs& inputs, DoctorProbes& probes) {
  if (inputs.hostname.empty())
    return warn("hostname", "this node has no hostname", "set one (hostnamectl set-hostname NAME)");
  const std::string shown = "hostname '" + inputs.hostname + "'";
  auto resolved = probes.resolve(inputs.hostname);
  if (!resolved)
    return warn("hostname",
                shown + " does not resolve (" + resolved.error().message +
                    "): tools that pass it to other nodes (torchrun, for one) fail",
                "add it to /etc/hosts with this node's address, or fix DNS");
  const auto& addresses = *resolved;
  if (addresses.empty())
    return warn("hostname", shown + " resolves to no address",
                "add it to /etc/hosts with this node's address");
  if (is_loopback(addresses.front()))
    return warn("hostname",
                shown + " resolves to " + addresses.front() +
                    " (loopback): other nodes told to connect to it would reach themselves",
                "map it to this node's real address in /etc/hosts (Debian writes 127.0.1.1 there); "
                "mcprun never uses the hostname as MASTER_ADDR, but torchrun and other tools do");
  return ok("hostname", shown + " resolves to " + join(addresses, ", "));
}

std::vector<CheckResult> check_clock(const DoctorInputs& inputs, DoctorProbes& probes) {
  const std::string name = "clock";
  if (inputs.rdzv_endpoint.empty()) return {};
  auto parsed = parse_endpoint(inputs.rdzv_endpoint, kConnectRules);
  if (!parsed) return {};  // The endpoint check says why.
  const Endpoint& endpoint = *parsed;
  auto reading = probes.read_clock(endpoint);
  if (!reading) {
    const std::string& error = reading.error().message;
    bool local = endpoint.is_unix();
    if (!local) {
      const FirstAddress address = first_address(endpoint.host, probes);
      local = address.error.empty() && is_local(address.address, probes);
    }
    // The rendezvous on this host shares this clock: there is nothing to compare.
    if (local)
      return {ok(name, "not measured (" + error +
                           "); the rendezvous is on this host, so its clock is this one")};
    return {warn(name, "not measured: " + error,
                 "make the rendezvous endpoint answer (see rdzv-endpoint)")};
  }
  const ClockReading& clock = *reading;
  // Judged at the near edge of the uncertainty: only a skew that is surely too large counts.
  const auto surely = std::chrono::abs(clock.skew) - clock.rtt / 2;
  const std::string finding = "this node's clock is " + describe_skew(clock.skew) +
                              " the rendezvous's (+- " + describe_duration(clock.rtt / 2) +
                              ", half the round trip)";
  const std::string remedy =
      "synchronise the clocks: chrony or systemd-timesyncd on every node (timedatectl shows "
      "'System clock synchronized: yes')";
  if (surely > kClockFailAbove)
    return {fail(name,
                 finding + ": above " + seconds_text(kClockFailAbove) +
                     " s, the clocks are not synchronised at all",
                 remedy)};
  if (surely > kClockWarnAbove)
    return {warn(name,
                 finding + ": above " + seconds_text(kClockWarnAbove) +
                     " s, the nodes' logs and failure reports no longer line up",
                 remedy)};
  return {ok(name, finding)};
}

}  // namespace mcprun
