// The checks of mcprun doctor: pure functions of DoctorInputs and what DoctorProbes answer.
#include "launcher/commands/doctor.hpp"

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
#include "launcher/config/slurm.hpp"

namespace mcprun {
namespace fs = std::filesystem;

std::string seconds_text(std::chrono::milliseconds limit) {
  return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(limit).count());
}

namespace {

/// NCCL's shared-memory segments stall at docker's 64 MB; the remedy names both ways to grow it.
constexpr const char* kShmRemedy =
    "docker: run with --ipc=host or --shm-size=8g (Kubernetes: an emptyDir with medium: Memory "
    "mounted at /dev/shm); a host: mount -o remount,size=8G /dev/shm";

std::optional<long> parse_long(std::string_view text) {
  long value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

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

/// InfiniBand/RoCE adapters show up under class/infiniband.
bool has_infiniband(const fs::path& sysfs) {
  std::error_code ec;
  fs::directory_iterator it(sysfs / "class" / "infiniband", ec);
  return !ec && it != fs::directory_iterator();
}

CheckResult ok(std::string name, std::string finding) {
  return {std::move(name), CheckStatus::kOk, std::move(finding), ""};
}
CheckResult warn(std::string name, std::string finding, std::string remedy) {
  return {std::move(name), CheckStatus::kWarn, std::move(finding), std::move(remedy)};
}
CheckResult fail(std::string name, std::string finding, std::string remedy) {
  return {std::move(name), CheckStatus::kFail, std::move(finding), std::move(remedy)};
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, separator);)
    if (!item.empty()) items.push_back(item);
  return items;
}

/// NCCL_SOCKET_IFNAME's rule: comma-separated prefixes, "=" for exact names, a leading "^" to
/// exclude the listed ones instead.
bool nccl_interface_matches(std::string spec, const std::string& interface) {
  const bool exclude = spec.starts_with("^");
  if (exclude) spec.erase(0, 1);
  const bool exact = spec.starts_with("=");
  if (exact) spec.erase(0, 1);
  bool listed = false;
  for (const std::string& item : split(spec, ','))
    listed = listed || (exact ? interface == item : interface.starts_with(item));
  return exclude ? !listed : listed;
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

/// The first address `host` resolves to, or why it has none.
struct FirstAddress {
  std::string address;
  std::string error;  ///< Set when `host` does not resolve.
};

FirstAddress first_address(const std::string& host, DoctorProbes& probes) {
  auto addresses = probes.resolve(host);
  if (!addresses) return {"", addresses.error().message};
  if (addresses->empty()) return {"", host + " has no address"};
  return {addresses->front(), ""};
}

/// "1,0": indices, unlike UUIDs, name a different card under each CUDA_DEVICE_ORDER.
bool names_gpus_by_index(const std::string& visible) {
  auto items = split(visible, ',');
  return std::any_of(items.begin(), items.end(),
                     [](const std::string& item) { return parse_long(item).has_value(); });
}

/// When an inherited variable has the effect its table row describes.
enum class Trigger { kAnyValue, kNonZero, kZero };

/// One inherited variable that changes how NCCL, torch or CUDA behave, and what to do about it.
struct KnownVariable {
  std::string_view name;
  Trigger trigger;
  CheckStatus status;
  std::string_view effect;
  std::string_view remedy;
};

/// Every variable the environment check explains, in one place.
constexpr KnownVariable kKnownVariables[] = {
    {"NCCL_P2P_DISABLE", Trigger::kNonZero, CheckStatus::kWarn,
     "GPU peer-to-peer off; all-reduce goes through host memory, several times slower",
     "unset it unless P2P is broken on this box (then fix the cause: IOMMU/ACS settings, a PCIe "
     "switch); it is a probe, not a setting to keep"},
    {"NCCL_P2P_LEVEL", Trigger::kAnyValue, CheckStatus::kOk,
     "NCCL uses peer-to-peer only up to this GPU-to-GPU distance (LOC turns it off)", ""},
    {"NCCL_SHM_DISABLE", Trigger::kNonZero, CheckStatus::kWarn,
     "shared-memory transport off; GPUs without a P2P path exchange data over sockets, far slower",
     "unset it once /dev/shm is large enough (see the shm check)"},
    {"NCCL_IB_DISABLE", Trigger::kNonZero, CheckStatus::kWarn,
     "InfiniBand/RoCE off; NCCL sends inter-node traffic over TCP sockets instead",
     "unset it to let NCCL use the InfiniBand adapters found here"},
    {"NCCL_NET_GDR_LEVEL", Trigger::kAnyValue, CheckStatus::kOk,
     "GPUDirect RDMA only up to this GPU-to-NIC distance; beyond it data is staged through host "
     "memory",
     ""},
    {"NCCL_DEBUG", Trigger::kAnyValue, CheckStatus::kOk,
     "NCCL logs at this level on every rank (INFO: its setup, rings and transports)", ""},
    {"NCCL_DEBUG_SUBSYS", Trigger::kAnyValue, CheckStatus::kOk, "the NCCL subsystems logged", ""},
    {"NCCL_ALGO", Trigger::kAnyValue, CheckStatus::kOk,
     "forces NCCL's collective algorithm; its own tuning is off", ""},
    {"NCCL_PROTO", Trigger::kAnyValue, CheckStatus::kOk,
     "forces NCCL's protocol; its own tuning is off", ""},
    {"NCCL_ASYNC_ERROR_HANDLING", Trigger::kZero, CheckStatus::kWarn,
     "a failed or timed-out collective no longer aborts the rank: the job hangs instead of failing",
     "unset it (mcprun then sets 1)"},
    {"TORCH_NCCL_ASYNC_ERROR_HANDLING", Trigger::kZero, CheckStatus::kWarn,
     "a failed or timed-out collective no longer aborts the rank: the job hangs instead of failing",
     "unset it (mcprun then sets 1)"},
    {"NCCL_BLOCKING_WAIT", Trigger::kNonZero, CheckStatus::kOk,
     "the host waits for every collective and raises on its timeout", ""},
    {"TORCH_NCCL_BLOCKING_WAIT", Trigger::kNonZero, CheckStatus::kOk,
     "the host waits for every collective and raises on its timeout", ""},
    {"TORCH_DISTRIBUTED_DEBUG", Trigger::kAnyValue, CheckStatus::kOk,
     "torch checks and logs every collective (DETAIL: slower, for diagnosis)", ""},
    {"CUDA_LAUNCH_BLOCKING", Trigger::kNonZero, CheckStatus::kWarn,
     "every CUDA kernel launch waits for the kernel to finish: a debugging setting, much slower",
     "unset it outside debugging"},
};

bool triggered(Trigger trigger, const std::string& value) {
  switch (trigger) {
    case Trigger::kAnyValue:
      return true;
    case Trigger::kNonZero:
      return parse_long(value).value_or(0) != 0;
    case Trigger::kZero:
      return value == "0";
  }
  return false;
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : separator) + item;
  return text;
}

/// The GT/s number of "16.0 GT/s PCIe"; nullopt for "Unknown" or garbage.
std::optional<double> link_speed_gts(const std::string& text) {
  try {
    size_t used = 0;
    double value = std::stod(text, &used);
    return used > 0 && value > 0 ? std::optional<double>(value) : std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

/// "16.0 GT/s PCIe" -> "16.0 GT/s".
std::string short_speed(const std::string& text) {
  auto suffix = text.find(" PCIe");
  return suffix == std::string::npos ? text : text.substr(0, suffix);
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

const char* status_name(CheckStatus status) {
  switch (status) {
    case CheckStatus::kOk:
      return "OK";
    case CheckStatus::kWarn:
      return "WARN";
    case CheckStatus::kFail:
      return "FAIL";
  }
  return "?";
}

// --- The checks -------------------------------------------------------------------------------

CheckResult check_shm(const DoctorInputs& inputs, DoctorProbes& probes) {
  const std::string path = inputs.shm_path.string();
  auto measured = probes.filesystem_space(inputs.shm_path);
  if (!measured)
    return fail("shm", measured.error().message + ": NCCL keeps its shared-memory segments there",
                std::string("mount a tmpfs there (mount -t tmpfs -o size=8G tmpfs /dev/shm); ") +
                    kShmRemedy);
  const FilesystemSpace& space = *measured;
  if (space.total_bytes == 0)  // A tmpfs mounted with size=0 has no limit and reports none.
    return warn("shm", path + " reports no size: it may be unlimited, or not a tmpfs at all",
                "check what is mounted there (findmnt " + path + ")");
  const std::string sizes = path + ": " + human_bytes(static_cast<double>(space.available_bytes)) + " free of " +
                            human_bytes(static_cast<double>(space.total_bytes));
  // Free space is what NCCL can use; a large but full /dev/shm holds a killed job's segments.
  const bool large_but_full = space.total_bytes >= kShmWarnBelowBytes;
  const std::string remedy = large_but_full
                                 ? "remove the stale segments of killed jobs (ls -la " + path + ")"
                                 : std::string(kShmRemedy);
  if (space.available_bytes < kShmFailBelowBytes)
    return fail("shm",
                sizes + ", below " + human_bytes(static_cast<double>(kShmFailBelowBytes)) +
                    ": NCCL's shared-memory transport stalls when it runs out",
                remedy);
  if (space.available_bytes < kShmWarnBelowBytes)
    return warn("shm",
                sizes + ", below " + human_bytes(static_cast<double>(kShmWarnBelowBytes)) +
                    ": enough for a few GPUs, tight for 8",
                remedy);
  return ok("shm", sizes);
}

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
    return {fail(name, "--rdzv-endpoint " + parsed.error().message,
                 "expected HOST:PORT or unix:PATH")};
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

namespace {

/// A variable mcprun sets for its workers, inherited from outside: the worker gets mcprun's.
CheckResult check_launcher_variable(const std::string& name, const std::string& variable,
                                    const std::string& shown) {
  std::string remedy =
      "unset it where it comes from (an outer torchrun, a wrapper framework, a job script): "
      "two parties setting up one process group hang it";
  if (variable == "MASTER_ADDR" || variable == "MASTER_PORT")
    remedy += "; meant for mcprun? pass --" +
              std::string(variable == "MASTER_ADDR" ? "master-addr" : "master-port");
  return warn(name, "inherited " + shown + ": mcprun replaces it for every worker", remedy);
}

/// CUDA_VISIBLE_DEVICES: empty, or indices that CUDA reads in another order than nvidia-smi.
CheckResult check_cuda_visible_devices(const std::string& name, const std::string& value,
                                       const std::string& shown, const Environment& env) {
  const auto order = env.find("CUDA_DEVICE_ORDER");
  const bool pci_order = order != env.end() && order->second == "PCI_BUS_ID";
  if (split(value, ',').empty())
    return warn(name, "CUDA_VISIBLE_DEVICES is empty: CUDA sees no GPU at all",
                "unset it, or name the GPUs to use");
  if (names_gpus_by_index(value) && !pci_order)
    return warn(
        name,
        shown +
            " without CUDA_DEVICE_ORDER=PCI_BUS_ID: indices then follow CUDA's fastest-first "
            "order, not nvidia-smi's (PCI) order, so an index may name another card",
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID, or name the GPUs by UUID (nvidia-smi -L); mcprun "
        "reads the indices in PCI order and sets both for its workers");
  return ok(name, shown + ": mcprun pins its workers within these GPUs");
}

/// NCCL_SOCKET_IFNAME: NCCL's own matching (prefixes, '=', '^') must find an interface here.
CheckResult check_nccl_socket_ifname(const std::string& name, const std::string& value,
                                     const std::string& shown,
                                     const std::vector<std::string>& interfaces) {
  std::vector<std::string> matched;
  for (const std::string& interface : interfaces)
    if (nccl_interface_matches(value, interface)) matched.push_back(interface);
  if (matched.empty())
    return warn(name, shown + ": no interface here matches, so NCCL finds no socket interface",
                "name an interface that exists (ip -br link): NCCL takes prefixes, '=' "
                "for exact names, a leading '^' to exclude");
  return ok(name, shown + ": NCCL's sockets use only " + join(matched, ", "));
}

/// GLOO_SOCKET_IFNAME: every interface it names must exist here. The interfaces are listed only
/// if it names one.
CheckResult check_gloo_socket_ifname(
    const std::string& name, const std::string& value, const std::string& shown,
    const std::function<const std::vector<std::string>&()>& interface_names) {
  std::vector<std::string> missing;
  for (const std::string& interface : split(value, ','))
    if (std::find(interface_names().begin(), interface_names().end(), interface) ==
        interface_names().end())
      missing.push_back(interface);
  if (!missing.empty())
    return warn(name,
                shown + ": no interface " + join(missing, ", ") + " here; Gloo fails to start",
                "name an interface that exists (ip -br link)");
  return ok(name, shown + ": Gloo's sockets use this interface");
}

/// The table's findings for `variable`: what setting it to `value` does to NCCL or torch.
void check_known_variable(const std::string& name, const std::string& variable,
                          const std::string& value, const std::string& shown,
                          const fs::path& sysfs_root, std::vector<CheckResult>& results) {
  for (const KnownVariable& known : kKnownVariables) {
    if (variable != known.name || !triggered(known.trigger, value)) continue;
    CheckResult result{name, known.status, shown + ": " + std::string(known.effect),
                       std::string(known.remedy)};
    // Without an adapter, turning InfiniBand off changes nothing.
    if (variable == "NCCL_IB_DISABLE" && !has_infiniband(sysfs_root)) {
      result.status = CheckStatus::kOk;
      result.finding += " (no InfiniBand adapter here: no effect)";
    }
    if (result.status == CheckStatus::kOk) result.remedy.clear();
    results.push_back(std::move(result));
  }
}

}  // namespace

std::vector<CheckResult> check_environment(const DoctorInputs& inputs, DoctorProbes& probes) {
  const std::string name = "environment";
  std::vector<CheckResult> results;
  std::optional<std::vector<std::string>> interfaces;  // Listed only when a variable names one.
  auto interface_names = [&]() -> const std::vector<std::string>& {
    if (!interfaces) interfaces = probes.interface_names();
    return *interfaces;
  };
  for (const auto& [variable, value] : inputs.env) {
    const std::string shown = variable + "=" + value;
    if (owned_by_launcher(variable) && variable != kLogLinePrefixTemplateVariable)
      results.push_back(check_launcher_variable(name, variable, shown));
    else if (variable == "CUDA_VISIBLE_DEVICES")
      results.push_back(check_cuda_visible_devices(name, value, shown, inputs.env));
    else if (variable == "NCCL_SOCKET_IFNAME")
      results.push_back(check_nccl_socket_ifname(name, value, shown, interface_names()));
    else if (variable == "GLOO_SOCKET_IFNAME")
      results.push_back(check_gloo_socket_ifname(name, value, shown, interface_names));
    else
      check_known_variable(name, variable, value, shown, inputs.sysfs_root, results);
  }
  if (results.empty())
    results.push_back(ok(name, "no inherited variable fights mcprun or changes NCCL"));
  return results;
}

std::vector<CheckResult> check_gpus(const DoctorInputs& inputs) {
  const std::string name = "gpus";
  const std::vector<GpuDevice> gpus = discover_gpus(inputs.sysfs_root);
  if (gpus.empty()) return {ok(name, "no NVIDIA GPU found; workers run on CPU")};
  std::vector<CheckResult> results;
  std::vector<std::string> listed, unknown_numa;
  std::set<int> numa_nodes;
  for (const GpuDevice& gpu : gpus) {
    listed.push_back(gpu.bus_id + " (NUMA " +
                     (gpu.numa_node < 0 ? "?" : std::to_string(gpu.numa_node)) + ")");
    if (gpu.numa_node < 0)
      unknown_numa.push_back(gpu.bus_id);
    else
      numa_nodes.insert(gpu.numa_node);
  }
  std::string summary = std::to_string(gpus.size()) + " GPU" + (gpus.size() == 1 ? "" : "s") +
                        ": " + join(listed, ", ");
  if (numa_nodes.size() > 1) {
    std::vector<std::string> nodes;
    for (int node : numa_nodes) nodes.push_back(std::to_string(node));
    summary += "; they span NUMA nodes " + join(nodes, ", ") +
               ": --bind numa keeps each worker's host memory next to its GPU";
  }
  results.push_back(ok(name, summary));
  if (!unknown_numa.empty())
    results.push_back(
        warn(name,
             "no NUMA affinity known for " + join(unknown_numa, ", ") +
                 " (numa_node -1): --bind numa cannot place their workers",
             "normal on a single-socket box; on a multi-socket one enable NUMA in the "
             "BIOS (and check that the kernel sees an ACPI SRAT)"));
  for (const GpuDevice& gpu : gpus) {
    std::vector<std::string> below;
    std::vector<std::string> remedies;
    if (gpu.link_width > 0 && gpu.max_link_width > 0 && gpu.link_width < gpu.max_link_width) {
      below.push_back("x" + std::to_string(gpu.link_width) + " of x" +
                      std::to_string(gpu.max_link_width));
      remedies.push_back(
          "an x8 slot, a riser or a lane-sharing BIOS setting cuts its host bandwidth: "
          "move it to a full-width slot, or check the slot's bifurcation setting");
    }
    auto speed = link_speed_gts(gpu.link_speed), max_speed = link_speed_gts(gpu.max_link_speed);
    if (speed && max_speed && *speed < *max_speed) {
      below.push_back(short_speed(gpu.link_speed) + " of " + short_speed(gpu.max_link_speed));
      remedies.push_back(
          "an idle GPU lowers its link speed to save power: recheck under load "
          "(nvidia-smi -q -d PCIE); if it stays low, the slot, a riser or the BIOS's "
          "PCIe generation setting limits it");
    }
    if (!below.empty())
      results.push_back(
          warn(name, "GPU " + gpu.bus_id + " runs at " + join(below, ", "), join(remedies, "; ")));
  }
  return results;
}

CheckResult check_memlock(const DoctorInputs& inputs) {
  if (!inputs.memlock_bytes) return ok("memlock", "locked memory is unlimited (what RDMA needs)");
  const bool infiniband = has_infiniband(inputs.sysfs_root);
  return warn(
      "memlock",
      "locked memory is limited to " + human_bytes(static_cast<double>(*inputs.memlock_bytes)) + " (ulimit -l " +
          std::to_string(*inputs.memlock_bytes / 1024) +
          "): InfiniBand/RDMA pins memory, and NCCL over IB fails or falls back to sockets" +
          (infiniband ? "" : " (no InfiniBand adapter here yet)"),
      "ulimit -l unlimited before starting mcprun; systemd: LimitMEMLOCK=infinity; docker: "
      "--ulimit memlock=-1; /etc/security/limits.conf: '* - memlock unlimited'");
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

std::vector<CheckResult> check_nccl(const DoctorInputs& inputs, DoctorProbes& probes) {
  const std::string name = "nccl";
  if (inputs.python.empty()) return {};
  auto probed = probes.torch_nccl(inputs.python, inputs.env);
  if (!probed)
    return {warn(name,
                 "cannot ask " + inputs.python + " for torch's NCCL: " + probed.error().message,
                 "set PYTHON_EXEC to the interpreter the workers run (a venv's python), or "
                 "pass --no-torch to skip this check")};
  const TorchNccl& torch = *probed;
  const std::string build = "torch " + torch.torch_version;
  if (torch.cuda_version.empty()) return {ok(name, build + " is a CPU build: no NCCL (gloo only)")};
  const std::string from = torch.libraries.empty() ? " (linked into torch)" : " from " + join(torch.libraries, ", ");
  if (!torch.load_error.empty() || torch.loaded.empty())
    return {warn(name, build + " (CUDA " + torch.cuda_version + ") cannot report its NCCL: " + torch.load_error,
                 "NCCL fails to load: check that libnccl.so.2 is found (ldd on torch's libtorch_cuda.so)")};
  if (torch.libraries.size() > 1)
    return {warn(name, build + " has " + std::to_string(torch.libraries.size()) + " NCCL libraries mapped" + from,
                 "two NCCLs in one process (LD_PRELOAD, or a system copy beside torch's): keep only torch's")};
  if (!torch.shipped.empty() && torch.shipped != torch.loaded)
    return {warn(name, build + " ships with NCCL " + torch.shipped + " but runs NCCL " + torch.loaded + from,
                 "a different NCCL (LD_LIBRARY_PATH or LD_PRELOAD) is a known cause of silent hangs: drop "
                 "it from those variables, or run the same NCCL on every node on purpose")};
  return {ok(name, build + " (CUDA " + torch.cuda_version + ") runs NCCL " + torch.loaded + from +
                       (torch.shipped.empty() ? "" : ", the version it ships with"))};
}

std::optional<std::string> DoctorProbes::slurm_node_address(const std::string& node) {
  return resolve_slurm_host(node);
}

std::vector<CheckResult> check_slurm(const DoctorInputs& inputs, DoctorProbes& probes) {
  const std::string name = "slurm";
  auto detected = detect_slurm_step(inputs.env);
  if (!detected)
    return {fail(name, detected.error().message + ": mcprun would refuse to start (exit 2)",
                 "start it as srun --ntasks-per-node=1 mcprun ..., or ignore Slurm with --no-slurm")};
  const std::optional<SlurmStep>& step = *detected;
  if (!step) {
    auto job = inputs.env.find("SLURM_JOB_ID");
    auto off = inputs.env.find("MCPRUN_SLURM");
    if (job == inputs.env.end() || job->second.empty() ||
        (off != inputs.env.end() && off->second == "0"))
      return {};
    // The batch script's shell has the job but no step: mcprun there is one node on its own.
    return {warn(name,
                 "Slurm job " + job->second +
                     ", but outside a step (the batch script or salloc's shell): mcprun would take "
                     "nothing from Slurm here and start this node's workers alone",
                 "start it on every node with srun --ntasks-per-node=1 mcprun ...")};
  }
  const std::string where = "Slurm job " + step->job_id + " step " + step->step_id + ", node " +
                            std::to_string(step->node_id) + " of " + std::to_string(step->nnodes);
  const std::string port = std::to_string(step->master_port());
  std::vector<std::string> taken = {"nnodes " + std::to_string(step->nnodes),
                                    "node rank " + std::to_string(step->node_id)};
  std::optional<std::string> address;
  if (!step->hosts.empty()) {
    const std::string& first = step->hosts.front();
    const FirstAddress found = first_address(first, probes);
    address = found.error.empty() ? std::optional(found.address) : probes.slurm_node_address(first);
    taken.push_back("master " + first + " (" + address.value_or("no address") + ") port " + port);
  }
  taken.push_back("run id " + step->run_id());
  taken.push_back("GPUs " + step->gpus.value_or("none"));
  std::vector<CheckResult> results = {
      ok(name, where + ": mcprun takes " + join(taken, ", ") +
                   " (with --rdzv-backend c10d node 0 hosts the rendezvous at that address and "
                   "port; a flag or PET_* variable wins over Slurm)")};
  if (step->max_tasks_per_node > 1)
    results.push_back(warn(name,
                           "Slurm started " + std::to_string(step->max_tasks_per_node) +
                               " tasks on one node: mcprun refuses to start (exit 2), since each "
                               "task would start every worker",
                           "run one task per node: srun --ntasks-per-node=1 mcprun ... (or "
                           "--no-slurm)"));
  if (step->hosts.empty()) return results;
  const std::string& first = step->hosts.front();
  if (!address) {
    results.push_back(fail("slurm-master",
                           "Slurm's first node " + first +
                               " resolves to no address (getaddrinfo, scontrol show node): mcprun "
                               "would refuse to start",
                           "add " + first + " to /etc/hosts or DNS, or give --master-addr (or "
                           "--rdzv-endpoint) yourself"));
    return results;
  }
  // The master-port check, aimed where Slurm points mcprun: a bind on node 0, a connect elsewhere.
  DoctorInputs master = inputs;
  master.master_addr = *address;
  master.master_port = port;
  for (CheckResult result : check_master_port(master, probes)) {
    result.name = "slurm-master";
    result.finding = "first node " + first + ": " + result.finding;
    results.push_back(std::move(result));
  }
  return results;
}

std::vector<CheckResult> run_checks(const DoctorInputs& inputs, DoctorProbes& probes) {
  std::vector<CheckResult> results;
  auto append = [&](std::vector<CheckResult> more) {
    for (CheckResult& result : more) results.push_back(std::move(result));
  };
  results.push_back(check_shm(inputs, probes));
  results.push_back(check_interface(inputs, probes));
  append(check_master_port(inputs, probes));
  append(check_rdzv_endpoint(inputs, probes));
  append(check_slurm(inputs, probes));
  append(check_environment(inputs, probes));
  append(check_gpus(inputs));
  results.push_back(check_memlock(inputs));
  results.push_back(check_hostname(inputs, probes));
  append(check_clock(inputs, probes));
  append(check_nccl(inputs, probes));
  return results;
}

int doctor_exit_code(const std::vector<CheckResult>& results) {
  return std::any_of(results.begin(), results.end(),
                     [](const CheckResult& r) { return r.status == CheckStatus::kFail; })
             ? kExitFailure
             : kExitSuccess;
}

}  // namespace mcprun
