#include "launcher/rendezvous/node_join.hpp"

#include <boost/asio/ip/address.hpp>
#include <filesystem>

#include "common/endpoint.hpp"
#include "common/logging.hpp"
#include "common/protocol.hpp"
#include "common/sys.hpp"
#include "launcher/rendezvous/etcd_rendezvous.hpp"

namespace mcprun {
namespace {

/// torchrun's is_host guess: the endpoint names this machine.
bool endpoint_is_local(const Endpoint& endpoint) {
  const std::string& host = endpoint.host;
  if (host == "localhost" || host == host_name()) return true;
  boost::system::error_code ec;
  auto address = boost::asio::ip::make_address(host, ec);
  if (ec) return false;
  return address.is_loopback() || interface_for_address(address.to_string()).has_value();
}

/// This node's pinned GPUs in local-rank order, as the rendezvous learns them with the join.
nlohmann::json gpu_topology(const RankPlan& plan) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const RankSlot& slot : plan.slots)
    if (const auto& gpu = slot.identity.gpu)
      gpus.push_back({{"local_rank", slot.identity.local_rank},
                      {"bus_id", gpu->bus_id},
                      {"numa_node", gpu->numa_node},
                      {"switch", gpu->switch_id()},
                      {"uuid", gpu->uuid}});
  return gpus;
}

/// The rendezvousd that leases this box's GPUs: $MCPRUN_DAEMON (unix:PATH; empty: none), else
/// the service's socket when it exists.
std::optional<std::string> lease_endpoint(const Environment& inherited) {
  std::string endpoint = kDefaultDaemonEndpoint;
  if (auto chosen = inherited.find("MCPRUN_DAEMON"); chosen != inherited.end())
    endpoint = chosen->second;
  auto parsed = parse_endpoint(endpoint, kConnectRules);
  if (!parsed || !parsed->is_unix()) {
    if (!endpoint.empty())
      spdlog::warn("MCPRUN_DAEMON={}: GPU leases need unix:PATH; not leasing", endpoint);
    return std::nullopt;
  }
  std::error_code ec;
  if (!std::filesystem::exists(parsed->unix_path, ec)) return std::nullopt;
  return endpoint;
}

/// How many GPUs to lease: one per rank when ranks are pinned, all of them for -n gpu|auto.
int gpus_wanted(const LaunchConfig& config, const std::vector<GpuDevice>& gpus) {
  if (config.no_pin || gpus.empty()) return 0;
  if (config.nproc.kind == NprocSpec::Kind::kCount) return config.nproc.count;
  return config.nproc.kind == NprocSpec::Kind::kCpu ? 0 : static_cast<int>(gpus.size());
}

}  // namespace

Expected<std::optional<NodeLease>> lease_from_local_daemon(boost::asio::io_context& io,
                                                           const LaunchConfig& config,
                                                           const Environment& inherited,
                                                           const std::vector<GpuDevice>& gpus) {
  auto endpoint = lease_endpoint(inherited);
  if (!endpoint) return std::optional<NodeLease>();
  NodeLease lease{std::make_unique<RendezvousClient>(io, *endpoint), {}};
  auto granted = lease.holder->lease(
      LeaseRequest{gpus_wanted(config, gpus), config.gpu_wait, config.rdzv_id, std::nullopt},
      std::chrono::milliseconds(static_cast<long>(config.gpu_wait * 1000)) + kConnectTimeout);
  if (!granted)
    return Error{"no GPU lease from rendezvousd at " + *endpoint + ": " + granted.error().message};
  lease.granted = std::move(*granted);
  return std::optional<NodeLease>(std::move(lease));
}

std::unique_ptr<RendezvousBackend> rendezvous_backend(
    boost::asio::io_context& io, const LaunchConfig& config,
    std::unique_ptr<RendezvousBackend> last_round) {
  if (!config.uses_etcd()) {
    last_round.reset();  // Its connection goes before the next one opens.
    return std::make_unique<RendezvousClient>(io, config.rdzv_endpoint);
  }
  etcd::Settings cluster;
  if (auto members = etcd_members(config.rdzv_endpoint))  // Checked with the flags already.
    cluster.members = std::move(*members);
  cluster.tls = config.etcd_tls.https;
  cluster.ca_file = config.etcd_tls.cacert;
  cluster.cert_file = config.etcd_tls.cert;
  cluster.key_file = config.etcd_tls.key;
  std::unique_ptr<EtcdRendezvous> previous(dynamic_cast<EtcdRendezvous*>(last_round.get()));
  if (previous) (void)last_round.release();
  return std::make_unique<EtcdRendezvous>(io, std::move(cluster), config.rdzv_id,
                                          std::move(previous));
}

std::unique_ptr<RendezvousServer> host_embedded_rendezvous(boost::asio::io_context& io,
                                                           const LaunchConfig& config) {
  // A unix socket or a malformed endpoint is never hosted here; the client says what is wrong.
  auto endpoint = parse_endpoint(config.rdzv_endpoint);
  if (!endpoint || !config.is_host.value_or(endpoint_is_local(*endpoint))) return nullptr;
  const int port = endpoint->port;
  try {
    auto server = std::make_unique<RendezvousServer>(
        io,
        boost::asio::ip::tcp::endpoint(boost::asio::ip::tcp::v4(),
                                       static_cast<unsigned short>(port)),
        ServerSettings{});
    spdlog::info("hosting the rendezvous for job '{}' on port {}", config.rdzv_id, port);
    return server;
  } catch (const boost::system::system_error& error) {
    // A rendezvousd already listens there (or another host agent): be its client instead.
    spdlog::debug("not hosting the rendezvous on port {}: {}", port, error.code().message());
    return nullptr;
  }
}

Expected<JoinMessage> join_message(const LaunchConfig& config, const RankPlan& plan,
                                   const std::string& node) {
  JoinMessage join;
  join.job = config.rdzv_id;
  join.node = node;
  join.nproc = static_cast<int>(plan.slots.size());
  join.master_port = plan.job.master_port;
  join.node_rank = config.node_rank.value_or(-1);
  join.labels = config.topology_labels;
  join.gpus = gpu_topology(plan);
  join.min_nodes = config.min_nodes;
  join.max_nodes = config.max_nodes;
  join.join_timeout_s = config.join_timeout;
  join.last_call_timeout_s = config.last_call_timeout;
  if (!config.rdzv_token_file.empty()) {
    auto token = read_token_file(config.rdzv_token_file);
    if (!token)
      return Error{"--rdzv-token-file " + config.rdzv_token_file + ": cannot read a token"};
    join.token = *token;
  }
  return join;
}

}  // namespace mcprun
