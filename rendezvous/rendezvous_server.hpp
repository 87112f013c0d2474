// The rendezvous service: many jobs at once over one Asio event loop. rendezvousd runs it as a
// daemon; mcprun can embed the same class.
#pragma once

#include <sys/types.h>

#include <array>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "common/connection_limits.hpp"
#include "common/framed_session.hpp"
#include "common/messages.hpp"
#include "rendezvous/agent_session.hpp"
#include "rendezvous/lease_queue.hpp"
#include "rendezvous/rendezvous_round.hpp"

namespace mcprun {

/// What the server has done since it started, for the daemon's metrics; counters only grow.
struct ServerStats {
  /// Upper bounds of the round-duration histogram's buckets, in seconds: 1 ms to 600 s.
  static constexpr std::array<double, 16> kRoundBuckets{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120, 600};
  uint64_t rounds = 0;  ///< Rounds that completed.
  std::array<uint64_t, kRoundBuckets.size()>
      rounds_within{};       ///< Rounds no longer than each bound.
  double round_seconds = 0;  ///< Completed rounds' durations (first join to complete), summed.
  uint64_t failures = 0;     ///< Rounds ended by a worker failure or a lost node.
  uint64_t stalls = 0;       ///< Rounds ended by a stall.
  uint64_t restarts = 0;  ///< New rounds of a job whose last round failed, stalled or lost a node.
  uint64_t heartbeats = 0;  ///< Agents' heartbeats: their rate is most of an idle daemon's work.

  void record_round(double seconds) {
    ++rounds;
    round_seconds += seconds;
    for (size_t i = 0; i < kRoundBuckets.size(); ++i)
      rounds_within[i] += seconds <= kRoundBuckets[i];
  }
};

/// What the server holds right now, for the daemon's metrics and its systemd status.
struct ServerLoad {
  size_t joining = 0, running = 0, finished = 0;  ///< Jobs by state; finished ones until forgotten.
  size_t nodes = 0;                               ///< Members of the jobs that have not finished.
  size_t connections = 0;                         ///< Agent and operator connections.
  size_t leased_gpus = 0;                         ///< GPUs leased to local jobs.
  size_t leased_ports = 0;                        ///< Master ports leased to local jobs.
};

/// How often the agents of a forming round hear who has joined (their terminal shows it).
inline constexpr std::chrono::seconds kProgressInterval{1};

/// Serves joins, heartbeats and failure notices; completes rounds and publishes assignments.
class RendezvousServer final : public SessionHost {
 public:
  RendezvousServer(boost::asio::io_context& io, const boost::asio::ip::tcp::endpoint& listen,
                   ServerSettings settings);
  boost::asio::ip::tcp::endpoint local_endpoint() const { return acceptor_.local_endpoint(); }
  /// Stops accepting and closes every session, telling no agent anything: running jobs keep going.
  void stop();
  /// Whether job `job_id` exists and has ended (all nodes done, failed, lost or timed out), and
  /// when it cannot restart, its unfinished nodes have heard so and left.
  bool job_finished(const std::string& job_id) const;

  // SessionHost: what its sessions report.
  void on_message(const std::shared_ptr<AgentSession>& session,
                  const nlohmann::json& message) override;
  void on_closed(const std::shared_ptr<AgentSession>& session) override;
  const ServerSettings& settings() const override { return settings_; }
  /// Takes reloaded settings, each read where it is used; the unix socket stays the one it serves.
  void reload(ServerSettings settings) {
    settings.unix_socket = settings_.unix_socket;
    settings_ = std::move(settings);
  }
  const ServerStats& stats() const { return stats_; }
  ServerLoad load() const;

 private:
  struct Job {
    std::unique_ptr<RendezvousRound> round;
    RoundSettings settings;  ///< Kept to open the next round with the same rules.
    std::map<std::string, std::weak_ptr<AgentSession>> members;  ///< node name -> session.
    std::set<std::string> done_nodes;  ///< Nodes whose workers all succeeded.
    bool restart_round = false;        ///< Opened by a node re-joining after a failure.
    bool closed = false;         ///< It ended with nodes done and others told it cannot restart.
    uint64_t generation = 0;     ///< Tells a restarted job from the round it replaced.
    int world_size = 0;          ///< Of the running round.
    int expected_nodes = 0;      ///< Nodes of the running round.
    std::optional<uid_t> owner;  ///< The local user who created it; nullopt: remote.
    Clock::time_point created_at;
    std::map<std::string, std::set<int>> barriers;  ///< Helper barrier name -> ranks there.
    std::unique_ptr<boost::asio::steady_timer> deadline;
    std::unique_ptr<boost::asio::steady_timer> progress;  ///< Armed while a progress note is due.
    bool running = false;
    bool finished = false;
    Clock::time_point finished_at;
  };
  void accept();
  void accept_local();
  void admit(boost::asio::generic::stream_protocol::socket socket, std::string peer,
             std::string peer_address, std::optional<uid_t> uid);
  /// Opens a fresh round of `job_id`, replacing whatever round it had.
  Job& open_round(const std::string& job_id, const RoundSettings& settings);
  /// Joins `node` into the current round of `job_id`; false (and the session refused) on error.
  bool join_round(const std::string& job_id, const std::shared_ptr<AgentSession>& session,
                  const NodeInfo& node);
  void handle_join(const std::shared_ptr<AgentSession>& session, const JoinMessage& message);
  /// A local job asks for GPUs and a master port; answered now, after a release, or refused.
  void handle_lease(const std::shared_ptr<AgentSession>& session, const LeaseRequest& request);
  /// Grants what waiting lease requests can now have (LeaseQueue's order) and tells each agent.
  void grant_waiting_leases();
  /// Drops a waiting request and refuses it, naming who holds the GPUs and who waits first.
  void refuse_waiting_lease(const std::shared_ptr<AgentSession>& session, int gpu_count);
  /// `mcprun jobs|status|stop` (rendezvousd/operator_requests.cpp).
  void handle_operator(const std::shared_ptr<AgentSession>& session,
                       const OperatorRequest& request);
  /// Whether the session may see, stop or join `job`: its owner or root on the unix socket,
  /// anyone over TCP (where the token is the authentication), anyone for a remote job.
  static bool may_access(const AgentSession& session, const Job& job);
  static std::string user_name(uid_t uid);
  /// An agent of a running job re-registers after losing its connection (a daemon restart).
  void handle_rejoin(const std::shared_ptr<AgentSession>& session, const JoinMessage& message);
  /// The messages of a joined agent about its job.
  void handle_job_message(const std::shared_ptr<AgentSession>& session, Job& job,
                          const HeartbeatMessage&);
  void handle_job_message(const std::shared_ptr<AgentSession>& session, Job& job,
                          const FailedNotice& failed);
  void handle_job_message(const std::shared_ptr<AgentSession>& session, Job& job,
                          const StallMessage& stall);
  void handle_job_message(const std::shared_ptr<AgentSession>& session, Job& job,
                          const StallReportMessage& report);
  void handle_job_message(const std::shared_ptr<AgentSession>& session, Job& job,
                          const StragglerMessage& straggler);
  void handle_job_message(const std::shared_ptr<AgentSession>& session, Job& job,
                          const BarrierArrival& arrival);
  void handle_job_message(const std::shared_ptr<AgentSession>& session, Job& job,
                          const DoneMessage&);
  /// `mcprun doctor`'s skew check: the daemon's wall clock.
  void answer_clock(AgentSession& session);
  /// A node of a replaced round reports success late: a restart round waiting for it never
  /// completes, so its nodes are told at once, as a restart join after that success would be.
  void handle_late_done(const AgentSession& session);
  /// Tells a node re-joining after a failure that the job is closed: `done_nodes` succeeded, and
  /// a restart needs every node, as torchrun's closed rendezvous does.
  void refuse_restart(AgentSession& session, const std::string& job_id,
                      const std::set<std::string>& done_nodes);
  void advance(const std::string& job_id);
  /// Tells a forming round's agents who joined so far, at most once per kProgressInterval.
  void schedule_progress(const std::string& job_id);
  void broadcast(Job& job, const nlohmann::json& message, const std::string& except_node = "");
  /// The heartbeat interval the agents held now call for: a third of the lease, or longer where
  /// they would pass max_heartbeats_per_second.
  std::chrono::milliseconds heartbeat_interval() const;
  /// `message` with the heartbeat interval `session` is paced at from now on.
  nlohmann::json paced(AgentSession& session, nlohmann::json message);
  void finish(const std::string& job_id);
  void forget_old_jobs();
  /// The job a session belongs to, unless that job was replaced by a newer round.
  Job* job_of(const AgentSession& session);

  boost::asio::io_context& io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::optional<boost::asio::local::stream_protocol::acceptor> local_acceptor_;
  ServerSettings settings_;
  std::map<std::string, Job> jobs_;
  std::set<std::shared_ptr<AgentSession>> sessions_;
  uint64_t next_generation_ = 1;
  LeaseQueue leases_;
  ServerStats stats_;
};

}  // namespace mcprun
