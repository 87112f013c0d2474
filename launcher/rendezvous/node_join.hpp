// What a node brings to the rendezvous: the GPU lease from the box's own rendezvousd, the backend
// it joins through, the round's server hosted in-process when this node is the endpoint
// (torchrun's c10d backend), and the join message it sends each round.
#pragma once

#include <boost/asio/io_context.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/expected.hpp"
#include "launcher/config/launch_config.hpp"
#include "launcher/plan/rank_plan.hpp"
#include "launcher/rendezvous/rendezvous_client.hpp"
#include "rendezvous/rendezvous_server.hpp"

namespace mcprun {

/// GPUs and a master port that the box's rendezvousd leased to this job.
struct NodeLease {
  std::unique_ptr<RendezvousClient> holder;  ///< The lease lasts as long as this connection.
  GrantedLease granted;
};

/// On a shared box, the local rendezvousd ($MCPRUN_DAEMON, unix:PATH; else the service's socket
/// where it exists) leases this job its GPUs and master port, so that two users' jobs never share
/// either: one per rank of `gpus` when pinned, all of them for -n gpu|auto. nullopt where no
/// rendezvousd leases them; the error names the daemon and why it refused.
Expected<std::optional<NodeLease>> lease_from_local_daemon(boost::asio::io_context& io,
                                                           const LaunchConfig& config,
                                                           const Environment& inherited,
                                                           const std::vector<GpuDevice>& gpus);

/// The backend --rdzv-backend names, for one round: rendezvousd's protocol at --rdzv-endpoint (a
/// rendezvousd, or the agent hosting the round), or the etcd cluster it lists. `last_round` is
/// this node's backend of the round before, if any: an etcd backend carries on its lease.
std::unique_ptr<RendezvousBackend> rendezvous_backend(
    boost::asio::io_context& io, const LaunchConfig& config,
    std::unique_ptr<RendezvousBackend> last_round);

/// Hosts the rendezvous in-process when this node is the endpoint (--rdzv-endpoint names this
/// machine, or --is-host says so) and nothing listens there yet; nullptr otherwise.
std::unique_ptr<RendezvousServer> host_embedded_rendezvous(boost::asio::io_context& io,
                                                           const LaunchConfig& config);

/// The join message of this node: its job, name, ranks, master port, topology labels and pinned
/// GPUs, the job's node range and timeouts, its token. The error names an unreadable token file.
Expected<JoinMessage> join_message(const LaunchConfig& config, const RankPlan& plan,
                                   const std::string& node);

}  // namespace mcprun
