#include "rendezvous/rendezvous_server.hpp"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/expected.hpp"
#include "common/logging.hpp"
#include "common/protocol.hpp"
#include "common/topology.hpp"
#include "rendezvous/agent_session.hpp"

namespace mcprun {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

/// Joins of one round logged at info level; the rest at debug.
constexpr size_t kJoinsLogged = 64;

/// This box's GPUs in topology order, the ones the daemon leases to local jobs.
std::vector<std::string> box_gpus() {
  std::vector<std::string> bus_ids;
  for (const GpuDevice& gpu : topology_order(discover_gpus()).gpus) bus_ids.push_back(gpu.bus_id);
  return bus_ids;
}

/// Whether nothing on this host holds `port` (a plain bind, as a job's store would need). On the
/// daemon's own loop: asio's system executor would start a thread pool, with its own descriptors.
bool port_is_free(asio::io_context& io, int port) {
  tcp::acceptor probe(io);
  boost::system::error_code ec;
  probe.open(tcp::v4(), ec);
  if (!ec) probe.bind({tcp::v4(), static_cast<unsigned short>(port)}, ec);
  return !ec;
}

/// The agents' listener, asking for `backlog`: 16,384 agents of a job may connect at once.
tcp::acceptor open_acceptor(asio::io_context& io, const tcp::endpoint& listen, int backlog) {
  tcp::acceptor acceptor(io, listen.protocol());
  acceptor.set_option(tcp::acceptor::reuse_address(true));
  acceptor.bind(listen);
  acceptor.listen(backlog);
  return acceptor;
}

}  // namespace

RendezvousServer::RendezvousServer(asio::io_context& io, const tcp::endpoint& listen,
                                   ServerSettings settings)
    : io_(io),
      acceptor_(open_acceptor(io, listen, settings.listen_backlog)),
      settings_(std::move(settings)),
      leases_(LeaseBook(box_gpus(), settings_.lease_port_first, settings_.lease_port_last),
              [&io](int port) { return port_is_free(io, port); }) {
  accept();
  if (!settings_.unix_socket.empty()) {
    ::unlink(settings_.unix_socket.c_str());  // A stale socket from a previous run.
    local_acceptor_.emplace(io, asio::local::stream_protocol::endpoint(settings_.unix_socket));
    // Every local user may connect; SO_PEERCRED then says who they are and what they may do.
    ::chmod(settings_.unix_socket.c_str(), 0666);
    accept_local();
  }
}

void RendezvousServer::stop() {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  if (local_acceptor_) {
    local_acceptor_->close(ignored);
    ::unlink(settings_.unix_socket.c_str());
  }
  // Forgotten before their sessions close, so that no agent hears of a lost node: the agents of
  // running jobs keep their workers and re-register with the next daemon.
  jobs_.clear();
  leases_.clear_waiting();
  auto sessions = sessions_;
  for (const auto& session : sessions) session->close();
}

RendezvousServer::Job* RendezvousServer::job_of(const AgentSession& session) {
  auto it = jobs_.find(session.job_id);
  return it != jobs_.end() && it->second.generation == session.generation ? &it->second : nullptr;
}

bool RendezvousServer::job_finished(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || !it->second.finished) return false;
  const Job& job = it->second;
  if (!job.closed) return true;
  // Nodes told that the job cannot restart decide on that word: it must reach them first.
  return std::none_of(job.members.begin(), job.members.end(), [&](const auto& member) {
    return !job.done_nodes.contains(member.first) && !member.second.expired();
  });
}

ServerLoad RendezvousServer::load() const {
  ServerLoad load{.connections = sessions_.size(),
                  .leased_gpus = leases_.leased_gpus(),
                  .leased_ports = leases_.leased_ports()};
  for (const auto& [id, job] : jobs_) {
    ++(job.finished ? load.finished : job.running ? load.running : load.joining);
    if (!job.finished) load.nodes += job.members.size();
  }
  return load;
}

void RendezvousServer::accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      boost::system::error_code remote_ec;
      auto remote = socket.remote_endpoint(remote_ec);
      const std::string address = remote_ec ? "" : remote.address().to_string();
      admit(asio::generic::stream_protocol::socket(std::move(socket)),
            address + ":" + (remote_ec ? "?" : std::to_string(remote.port())), address,
            std::nullopt);
    }
    accept();
  });
}

void RendezvousServer::accept_local() {
  local_acceptor_->async_accept(
      [this](boost::system::error_code ec, asio::local::stream_protocol::socket socket) {
        if (ec == asio::error::operation_aborted) return;
        if (!ec) {
          ucred peer{};
          socklen_t length = sizeof peer;
          std::optional<uid_t> uid;
          if (::getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &peer, &length) == 0)
            uid = peer.uid;
          // A local agent's peers reach this host on loopback.
          admit(asio::generic::stream_protocol::socket(std::move(socket)),
                "unix uid " + (uid ? std::to_string(*uid) : std::string("?")), "127.0.0.1", uid);
        }
        accept_local();
      });
}

void RendezvousServer::admit(asio::generic::stream_protocol::socket socket, std::string peer,
                             std::string peer_address, std::optional<uid_t> uid) {
  if (sessions_.size() >= settings_.max_connections) {
    spdlog::warn("connection limit {} reached; refusing {}", settings_.max_connections, peer);
    return;
  }
  auto session = std::make_shared<AgentSession>(FramedSession::Socket(std::move(socket)), *this,
                                                std::move(peer), std::move(peer_address), uid);
  sessions_.insert(session);
  session->start();
}

void RendezvousServer::on_message(const std::shared_ptr<AgentSession>& session,
                                  const nlohmann::json& message) {
  auto decoded = decode_agent_message(message);
  if (!decoded) return session->refuse(decoded.error().message);
  stats_.heartbeats += std::holds_alternative<HeartbeatMessage>(*decoded);
  std::visit(
      MessageHandlers{[&](const JoinMessage& join) {
                        join.assignment ? handle_rejoin(session, join) : handle_join(session, join);
                      },
                      [&](const OperatorRequest& request) { handle_operator(session, request); },
                      [&](const LeaseRequest& request) { handle_lease(session, request); },
                      [&](const ClockRequest&) { answer_clock(*session); },
                      [&](const auto& about_job) {
                        using Message = std::decay_t<decltype(about_job)>;
                        // A lease holder heartbeats its connection, which holds no job.
                        if (std::is_same_v<Message, HeartbeatMessage> && session->lease_id != 0)
                          return;
                        if (session->job_id.empty())
                          return session->refuse("'" + message_type(message) + "' before 'join'");
                        Job* job = job_of(*session);
                        if (!job) {  // A message about a round that has been replaced.
                          if constexpr (std::is_same_v<Message, DoneMessage>)
                            handle_late_done(*session);
                          return;
                        }
                        handle_job_message(session, *job, about_job);
                      }},
      *decoded);
}

void RendezvousServer::answer_clock(AgentSession& session) {
  // `mcprun doctor` measures skew with it, before any join.
  const nlohmann::json now =
      encode(ClockReply{std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count()});
  // An unauthenticated peer gets one answer, so it cannot hold a connection open with clocks.
  if (session.job_id.empty() && session.lease_id == 0) return session.reply_and_close(now);
  session.send(now);
}

void RendezvousServer::handle_job_message(const std::shared_ptr<AgentSession>&, Job&,
                                          const HeartbeatMessage&) {}

void RendezvousServer::handle_job_message(const std::shared_ptr<AgentSession>& session, Job& job,
                                          const FailedNotice& failed) {
  if (!job.finished) ++stats_.failures;  // Counted once per round, however many nodes report.
  spdlog::info("job {}: node {} reports a failure; stopping every node", session->job_id,
               session->node);
  FailedNotice relayed = failed;
  relayed.node = session->node;
  broadcast(job, encode(relayed), session->node);
  finish(session->job_id);
  // After the round's end (and its "closed", if nobody can restart): the node may decide.
  session->send(encode(FailureNoted{}));
}

void RendezvousServer::handle_job_message(const std::shared_ptr<AgentSession>& session, Job& job,
                                          const StallMessage& stall) {
  if (!job.finished) ++stats_.stalls;
  spdlog::warn("job {}: node {} declares a stall: {}; stopping every node", session->job_id,
               session->node, stall.what);
  StallMessage relayed = stall;
  relayed.body["node"] = session->node;
  broadcast(job, encode(relayed), session->node);
  finish(session->job_id);
}

void RendezvousServer::handle_job_message(const std::shared_ptr<AgentSession>& session, Job& job,
                                          const StallReportMessage& report) {
  // Each node's view of its ranks, for every node's report.
  StallReportMessage relayed = report;
  relayed.node = session->node;
  broadcast(job, encode(relayed), session->node);
}

void RendezvousServer::handle_job_message(const std::shared_ptr<AgentSession>& session, Job& job,
                                          const StragglerMessage& straggler) {
  // The store host's line, for every other node's console.
  StragglerMessage relayed = straggler;
  relayed.node = session->node;
  broadcast(job, encode(relayed), session->node);
}

void RendezvousServer::handle_job_message(const std::shared_ptr<AgentSession>&, Job& job,
                                          const BarrierArrival& arrival) {
  std::set<int>& arrived = job.barriers[arrival.name];
  arrived.insert(arrival.rank);
  if (static_cast<int>(arrived.size()) < job.world_size) return;
  broadcast(job, encode(BarrierDone{arrival.name}));
  job.barriers.erase(arrival.name);
}

void RendezvousServer::handle_job_message(const std::shared_ptr<AgentSession>& session, Job& job,
                                          const DoneMessage&) {
  session->done = true;
  job.done_nodes.insert(session->node);
  if (job.done_nodes.size() == job.members.size()) finish(session->job_id);
}

namespace {

/// "closed": the job cannot restart, because `done_nodes` finished and a restart needs every node.
ClosedNotice closed_notice(const std::string& job_id, const std::set<std::string>& done_nodes) {
  std::string names;
  for (const auto& name : done_nodes) names += (names.empty() ? "" : ", ") + name;
  return {"job " + job_id + " cannot restart: node(s) " + names +
          " finished with every worker's success, and a restart needs every node"};
}

/// What a join (or a rejoin) asks for.
struct JoinRequest {
  std::string job_id;
  NodeInfo node;
  RoundSettings round;
};

/// Authenticates a parsed join (or rejoin: it carries its assignment) on a connection that has
/// joined nothing yet, and turns it into the round's terms; a one-line reason when refused.
Expected<JoinRequest> join_request(const AgentSession& session, const JoinMessage& message,
                                   const ServerSettings& settings) {
  if (!session.job_id.empty())
    return Error{message.assignment ? "'rejoin' on a joined connection"
                                    : "second 'join' on one connection"};
  if (!settings.token.empty() && !tokens_equal(message.token, settings.token))
    return Error{"authentication failed: wrong or missing token"};
  JoinRequest request;
  NodeInfo& node = request.node;
  RoundSettings& round = request.round;
  round.label_precedence = settings.label_precedence;
  request.job_id = message.job;
  node.node = message.node;
  node.nproc = message.nproc;
  node.master_port = message.master_port;
  node.requested_rank = message.node_rank;
  node.addr = message.addr.empty() ? session.peer_address() : message.addr;
  node.labels = message.labels;
  node.gpu_count = static_cast<int>(message.gpus.size());
  round.min_nodes = message.min_nodes;
  round.max_nodes = message.max_nodes;
  round.join_timeout = std::chrono::milliseconds(static_cast<long>(1000 * message.join_timeout_s));
  round.last_call_timeout =
      std::chrono::milliseconds(static_cast<long>(1000 * message.last_call_timeout_s));
  return request;
}

}  // namespace

void RendezvousServer::handle_late_done(const AgentSession& session) {
  auto it = jobs_.find(session.job_id);
  if (it == jobs_.end() || !it->second.restart_round || it->second.running) return;
  Job& job = it->second;
  job.done_nodes.insert(session.node);
  if (!job.finished) finish(session.job_id);  // Which tells the round's nodes the job is closed.
}

void RendezvousServer::refuse_restart(AgentSession& session, const std::string& job_id,
                                      const std::set<std::string>& done_nodes) {
  const ClosedNotice closed = closed_notice(job_id, done_nodes);
  spdlog::warn("{}: {}", session.peer(), closed.message);
  session.reply_and_close(encode(closed));
}

void RendezvousServer::handle_join(const std::shared_ptr<AgentSession>& session,
                                   const JoinMessage& message) {
  auto parsed = join_request(*session, message, settings_);
  if (!parsed) return session->refuse(parsed.error().message);
  auto& [job_id, node, round] = *parsed;

  auto it = jobs_.find(job_id);
  if (it != jobs_.end() && !it->second.finished && !may_access(*session, it->second))
    return session->refuse("job " + job_id + " belongs to " + user_name(*it->second.owner) +
                           "; only that user or root may join it from this host");
  if (it == jobs_.end() || it->second.finished) {
    if (it != jobs_.end() && message.restart_count > 0 && !it->second.done_nodes.empty())
      return refuse_restart(*session, job_id, it->second.done_nodes);
    // The survivors of a round that failed, stalled or lost a node re-join: a restart.
    if (it != jobs_.end() && it->second.running &&
        it->second.done_nodes.size() < it->second.members.size())
      ++stats_.restarts;
    Job& opened = open_round(job_id, round);  // A finished job's id may be reused.
    opened.owner = session->uid;
    opened.restart_round = message.restart_count > 0;
  } else if (it->second.running) {
    Job& running = it->second;
    if (running.members.size() >= static_cast<size_t>(running.settings.max_nodes))
      return session->refuse("job " + job_id + " is running with all " +
                             std::to_string(running.settings.max_nodes) +
                             " nodes; it admits no new node");
    // Elastic scale-up: the newcomer opens the next round, and the running nodes re-form into it
    // at this restart boundary, as torchrun does when nodes are waiting.
    spdlog::info("job {}: {} asks to join the running round; re-forming with it", job_id,
                 node.node);
    Job old = std::move(running);
    open_round(job_id, old.settings).owner = old.owner;
    broadcast(old, encode(MembershipNotice{node.node}));
    old.deadline->cancel();
  }
  session->shows_progress = message.progress;
  if (!join_round(job_id, session, node)) return;
  advance(job_id);
  schedule_progress(job_id);
}

void RendezvousServer::schedule_progress(const std::string& job_id) {
  Job& job = jobs_.at(job_id);
  if (job.running || job.finished || job.progress->expiry() > Clock::now()) return;
  job.progress->expires_after(kProgressInterval);
  job.progress->async_wait(
      [this, job_id, generation = job.generation](boost::system::error_code ec) {
        auto it = jobs_.find(job_id);
        if (ec || it == jobs_.end() || it->second.generation != generation) return;
        Job& forming = it->second;
        if (forming.running || forming.finished) return;
        constexpr size_t kNamesShown = 8;
        std::vector<std::string> names;
        for (const auto& [name, member] : forming.members)
          if (names.size() < kNamesShown) names.push_back(name);
        const auto remaining =
            std::chrono::duration<double>(forming.round->next_deadline() - Clock::now());
        // Only to the agents on a terminal: a round of 16,384 agents in batch jobs would be sent
        // 16,384 frames a second that nobody reads.
        const std::string frame = encode_frame(encode(
            ProgressMessage{static_cast<int>(forming.members.size()), forming.settings.min_nodes,
                            forming.settings.max_nodes, names, std::max(0.0, remaining.count())}));
        for (auto& [name, member] : forming.members)
          if (auto agent = member.lock(); agent && agent->shows_progress) agent->send_frame(frame);
      });
}

void RendezvousServer::handle_rejoin(const std::shared_ptr<AgentSession>& session,
                                     const JoinMessage& message) {
  auto parsed = join_request(*session, message, settings_);
  if (!parsed) return session->refuse(parsed.error().message);
  auto& [job_id, node, round] = *parsed;
  const int world_size = message.assignment->world_size;
  const int group_world_size = message.assignment->group_world_size;

  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.finished) {
    // This daemon restarted (or forgot the job): rebuild the running job from its agents.
    Job& job = open_round(job_id, round);
    job.owner = session->uid;
    job.running = true;
    job.world_size = world_size;
    job.expected_nodes = group_world_size;
    spdlog::info("job {}: rebuilding a running job of {} node(s) from its agents", job_id,
                 group_world_size);
    // Nodes that do not come back within a lease are lost, as if they had gone silent.
    job.deadline->expires_after(settings_.lease);
    job.deadline->async_wait([this, job_id = job_id,
                              generation = job.generation](boost::system::error_code ec) {
      auto found = jobs_.find(job_id);
      if (ec || found == jobs_.end() || found->second.generation != generation) return;
      Job& rebuilt = found->second;
      if (static_cast<int>(rebuilt.members.size()) >= rebuilt.expected_nodes) return;
      const std::string missing = std::to_string(rebuilt.expected_nodes - rebuilt.members.size()) +
                                  " node(s) that did not come back after the restart";
      spdlog::warn("job {}: {}; stopping every node", job_id, missing);
      ++stats_.failures;
      broadcast(rebuilt, encode(LostNotice{missing}));
      finish(job_id);
    });
    it = jobs_.find(job_id);
  }
  Job& job = it->second;
  if (!job.running || job.world_size != world_size)
    return session->refuse("job " + job_id +
                           " runs a different round; this node's assignment "
                           "is stale");
  session->job_id = job_id;
  session->generation = job.generation;
  session->node = node.node;
  job.members[node.node] = session;
  session->send(paced(*session, encode(JoinedMessage{})));
  spdlog::info("job {}: {} re-registered ({} of {} node(s))", job_id, node.node, job.members.size(),
               job.expected_nodes);
  if (static_cast<int>(job.members.size()) < job.expected_nodes) return;
  job.deadline->cancel();
  // The nodes that came back first were told a pace for fewer agents.
  for (auto& [name, member] : job.members)
    if (auto agent = member.lock(); agent && agent->heartbeat_interval() < heartbeat_interval())
      agent->send(paced(*agent, encode(PaceMessage{})));
}

void RendezvousServer::handle_lease(const std::shared_ptr<AgentSession>& session,
                                    const LeaseRequest& request) {
  if (!session->uid)
    return session->refuse("leases are for jobs on this host: use the unix socket");
  if (session->lease_id != 0) return session->refuse("second 'lease' on one connection");
  const int gpu_count = request.gpus;
  const double wait_s = request.wait_s;
  if (gpu_count >
      static_cast<int>(leases_.gpu_count()))  // Waiting would block the queue for nothing.
    return session->refuse(std::to_string(gpu_count) + " GPU(s) wanted, but this box has " +
                           std::to_string(leases_.gpu_count()));
  const std::string holder = user_name(*session->uid) + ", job " + request.job;
  if (request.held) {
    // A running job re-registers what it held before this daemon restarted.
    Lease held{request.held->gpus, request.held->port, holder};
    const auto id = leases_.restore(held);
    if (!id) return session->refuse("the GPUs or port this job held are leased to another job now");
    session->lease_id = *id;
    spdlog::info("restored the lease of {} GPU(s) and port {} to {}", held.gpus.size(), held.port,
                 holder);
    return session->send(paced(*session, encode(LeaseGrant{held.gpus, held.port})));
  }
  std::unique_ptr<asio::steady_timer> deadline;
  if (wait_s > 0) {
    deadline = std::make_unique<asio::steady_timer>(
        io_, std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::duration<double>(wait_s)));
    deadline->async_wait(
        [this, weak = std::weak_ptr(session), gpu_count](boost::system::error_code ec) {
          if (ec) return;
          auto waiting = weak.lock();
          if (!waiting || waiting->lease_id != 0) return;
          refuse_waiting_lease(waiting, gpu_count);
          grant_waiting_leases();  // The ones it held back may fit now.
        });
  }
  leases_.enqueue(session, gpu_count, holder, std::move(deadline));
  grant_waiting_leases();
  if (session->lease_id != 0) return;
  // Not allowed to wait: refuse at once, naming who holds what.
  if (wait_s <= 0) return refuse_waiting_lease(session, gpu_count);
  const std::string queued = leases_.position(session.get(), gpu_count);
  spdlog::info("{} waits up to {:g} s: {}", holder, wait_s, queued);
  session->send(encode(QueuedNotice{queued}));
}

void RendezvousServer::refuse_waiting_lease(const std::shared_ptr<AgentSession>& session,
                                            int gpu_count) {
  const std::string reason = leases_.position(session.get(), gpu_count);
  leases_.withdraw(session.get());
  session->refuse(reason);
}

void RendezvousServer::grant_waiting_leases() {
  for (LeaseQueue::Grant& grant : leases_.grant_waiting()) {
    auto session = std::static_pointer_cast<AgentSession>(grant.waiter);
    const Lease& lease = grant.lease;
    session->lease_id = grant.id;
    spdlog::info("leased {} GPU(s) and port {} to {}", lease.gpus.size(), lease.port, lease.holder);
    session->send(paced(*session, encode(LeaseGrant{lease.gpus, lease.port})));
  }
}

RendezvousServer::Job& RendezvousServer::open_round(const std::string& job_id,
                                                    const RoundSettings& settings) {
  Job job;
  job.settings = settings;
  job.round = std::make_unique<RendezvousRound>(settings, Clock::now());
  job.deadline = std::make_unique<asio::steady_timer>(io_);
  job.progress = std::make_unique<asio::steady_timer>(io_);
  job.generation = next_generation_++;
  job.created_at = Clock::now();
  return jobs_.insert_or_assign(job_id, std::move(job)).first->second;
}

bool RendezvousServer::join_round(const std::string& job_id,
                                  const std::shared_ptr<AgentSession>& session,
                                  const NodeInfo& node) {
  Job& job = jobs_.at(job_id);
  if (auto error = job.round->join(node, Clock::now())) {
    session->refuse("job " + job_id + ": " + *error);
    return false;
  }
  session->job_id = job_id;
  session->generation = job.generation;
  session->node = node.node;
  job.members[node.node] = session;
  // The agent heartbeats from now on, through the join wait too.
  session->send(paced(*session, encode(JoinedMessage{})));
  // A line for each of a large round's joins would flood the journal: the first few say who
  // comes, the round's completion how many came.
  const size_t joined = job.round->joined();
  spdlog::log(joined <= kJoinsLogged ? spdlog::level::info : spdlog::level::debug,
              "job {}: {} ({}, {} worker(s), {} GPU(s)) joined, {} node(s) so far{}", job_id,
              node.node, node.addr, node.nproc, node.gpu_count, joined,
              joined == kJoinsLogged ? "; the next joins are logged at debug level" : "");
  return true;
}

void RendezvousServer::advance(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (job.running || job.finished) return;
  switch (job.round->advance(Clock::now())) {
    case RendezvousRound::State::kComplete: {
      job.running = true;
      job.deadline->cancel();
      const RoundResult& result = job.round->result();
      job.world_size = result.world_size;
      job.expected_nodes = static_cast<int>(result.nodes.size());
      stats_.record_round(std::chrono::duration<double>(Clock::now() - job.created_at).count());
      for (const auto& node : result.nodes) {
        auto member = job.members[node.node].lock();
        if (!member) continue;
        // Paced again: the agents that joined first were told a pace for fewer agents.
        member->send(paced(
            *member, encode(AssignmentMessage{
                         node.group_rank, static_cast<int>(result.nodes.size()), result.world_size,
                         node.rank_offset, result.master_addr, result.master_port})));
      }
      spdlog::info("job {}: round complete, {} nodes, world size {}, master {}:{}", job_id,
                   result.nodes.size(), result.world_size, result.master_addr, result.master_port);
      return;
    }
    case RendezvousRound::State::kTimedOut: {
      const std::string message = job.round->timeout_message();
      spdlog::warn("job {}: {}", job_id, message);
      broadcast(job, encode(ErrorMessage{message}));
      return finish(job_id);
    }
    case RendezvousRound::State::kJoining:
      job.deadline->expires_at(job.round->next_deadline());
      job.deadline->async_wait([this, job_id](boost::system::error_code ec) {
        if (!ec) advance(job_id);
      });
      return;
  }
}

void RendezvousServer::broadcast(Job& job, const nlohmann::json& message,
                                 const std::string& except_node) {
  const std::string frame = encode_frame(message);  // Once, however many nodes hear it.
  for (auto& [name, member] : job.members)
    if (name != except_node)
      if (auto session = member.lock()) session->send_frame(frame);
}

std::chrono::milliseconds RendezvousServer::heartbeat_interval() const {
  using std::chrono::milliseconds;
  const auto spread = std::chrono::duration<double>(static_cast<double>(sessions_.size()) /
                                                    settings_.max_heartbeats_per_second);
  return std::max({milliseconds(50), settings_.lease / 3, std::chrono::ceil<milliseconds>(spread)});
}

nlohmann::json RendezvousServer::paced(AgentSession& session, nlohmann::json message) {
  message["heartbeat_interval_ms"] = session.pace(heartbeat_interval()).count();
  return message;
}

void RendezvousServer::finish(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  // Ended by a failure, a stall or a lost node after some nodes finished: nobody can restart.
  const bool unfinished_members =
      std::any_of(job.members.begin(), job.members.end(),
                  [&](const auto& member) { return !job.done_nodes.contains(member.first); });
  if (!job.finished && !job.done_nodes.empty() && unfinished_members) {
    broadcast(job, encode(closed_notice(job_id, job.done_nodes)));
    job.closed = true;
  }
  job.finished = true;
  job.finished_at = Clock::now();
  job.deadline->cancel();
  forget_old_jobs();
}

void RendezvousServer::forget_old_jobs() {
  const auto now = Clock::now();
  std::erase_if(jobs_, [&](const auto& entry) {
    return entry.second.finished && now - entry.second.finished_at > settings_.finished_job_ttl;
  });
}

void RendezvousServer::on_closed(const std::shared_ptr<AgentSession>& session) {
  sessions_.erase(session);
  const bool held_lease = session->lease_id != 0;
  if (held_lease) {  // The job ended or its agent died: its GPUs and port are free.
    leases_.release(session->lease_id);
    session->lease_id = 0;
  }
  // A waiting request leaves the queue with its connection: the ones behind it may fit now.
  const bool was_waiting = leases_.withdraw(session.get());
  if (held_lease || was_waiting) grant_waiting_leases();
  if (session->job_id.empty()) return;
  Job* current = job_of(*session);
  if (!current) return;
  Job& job = *current;
  if (job.finished || session->done) return;
  // The node re-registered on a new connection before this one's end was noticed.
  if (auto member = job.members.find(session->node);
      member != job.members.end() && member->second.lock() != session)
    return;
  if (!job.running) {
    job.round->leave(session->node);
    job.members.erase(session->node);
    spdlog::info("job {}: {} left before the round completed", session->job_id, session->node);
    return;
  }
  spdlog::warn("job {}: node {} lost; stopping every other node", session->job_id, session->node);
  ++stats_.failures;
  broadcast(job, encode(LostNotice{session->node}), session->node);
  finish(session->job_id);
}

}  // namespace mcprun
