// The rendezvous on an etcd cluster that users already run (--rdzv-backend etcd or etcd-v2, both on
// etcd's v3 API): the round lives in etcd, so no process of the job hosts it, and a dead or
// stopped etcd member costs one request deadline. Every key of job J lies under /mcprun/J/, on
// the lease of the agent that wrote it, so nothing of a job outlives its agents by more than the
// lease's TTL:
//
//   r/<n>/node/<node>         the node's NodeInfo: it joined round n
//   r/<n>/result              the completed round's ranks (or why it timed out), created once by
//                             the round's conductor: the node whose key was created first
//   r/<n>/event/<node>/<seq>  what the node tells the others: an agent message's JSON
//   r/<n>/done/<node>         every worker of the node succeeded
//   r/<n>/end                 why the round ended (a failure, a stall, a lost node)
//   placed/<n>/<node>         the node took its place in round n: the round runs
//
// A running node hears round n's keys and round n+1's joins: a node key deleted while the round
// runs is a lost node, a join into round n+1 a node joining the running job. Only the conductor
// reads every join; the others wait on the result key, so that forming N nodes costs O(N) events.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "launcher/etcd/etcd_client.hpp"
#include "launcher/rendezvous/rendezvous_backend.hpp"
#include "rendezvous/rendezvous_round.hpp"

namespace mcprun {

/// How long an agent's keys outlive it: a SIGKILLed node is found lost this long after it died
/// (plus an election, when a new etcd leader resets every lease to its full TTL).
inline constexpr std::chrono::seconds kEtcdLeaseTtl{10};
/// How long one watch request waits for an event before it is renewed: the longest a node's
/// agent waits for its watcher to stop.
inline constexpr std::chrono::seconds kEtcdWatchRenewal{2};

/// "/mcprun/<job>/", with '/' and '%' in the job id escaped, so that no job's keys lie under
/// another's prefix.
std::string etcd_job_prefix(const std::string& job);

class EtcdRendezvous final : public RendezvousBackend {
 public:
  /// `previous_round`: this node's backend of the round before, whose lease and round number
  /// this one takes over; nullptr for the first round.
  EtcdRendezvous(boost::asio::io_context& io, etcd::Settings cluster, std::string job,
                 std::unique_ptr<EtcdRendezvous> previous_round);
  /// Stops the threads and, unless a next round took it over or this node finished while others
  /// run, revokes the lease: this node's keys go at once.
  ~EtcdRendezvous() override;
  EtcdRendezvous(const EtcdRendezvous&) = delete;
  EtcdRendezvous& operator=(const EtcdRendezvous&) = delete;

  Expected<Assignment> join(JoinMessage join, std::chrono::milliseconds limit) override;
  void watch(PeerEvents events) override;
  void send(const AgentMessage& message) override;
  void report_failure(const std::string& reason, int exit_code,
                      nlohmann::json preflight = nullptr) override;
  void await_failure_noted(std::chrono::milliseconds limit) override;
  void report_done() override;
  std::string local_address() const override { return local_address_; }
  const std::optional<std::string>& job_closed() const override { return job_closed_; }

 private:
  /// A completed round as this node took it: its share, the nodes, and the revision to watch from.
  struct Formed {
    Assignment assignment;
    std::set<std::string> nodes;
    int64_t revision = 0;
    int64_t round = 0;
    std::string local_address;
  };

  // The worker thread's: joins, writes and keep-alives, in order, on `client_`.
  void run_tasks();
  void enqueue(std::function<void()> task);
  /// Runs `task` on this backend's io thread, unless the backend is gone by then.
  void post(std::function<void(EtcdRendezvous&)> task);
  void keep_alive_if_due();
  /// Runs `call` until it answers or `deadline` passes; etcd errors while a member is elected or
  /// the client moves to another member are retried.
  template <class Call>
  auto retrying(Clock::time_point deadline, Call call) -> decltype(call());
  Expected<Formed> form_round(JoinMessage join, Clock::time_point deadline);
  /// The round to join: the forming one, or the one after a running or ended one.
  Expected<int64_t> choose_round(const JoinMessage& join, Clock::time_point deadline);
  /// Waits for round `round`'s result; nullopt when it completed without this node.
  Expected<std::optional<Formed>> await_result(int64_t round, const JoinMessage& join,
                                               Clock::time_point deadline);
  /// The conductor's part: reads every join until the round completes, then publishes it.
  Expected<std::optional<Formed>> conduct(int64_t round, const JoinMessage& join,
                                          Clock::time_point deadline);
  /// A result key's value, for this node.
  Expected<std::optional<Formed>> take_result(int64_t round, const etcd::KeyValue& result,
                                              const std::string& node);
  /// Writes `value` at `key` on the lease, retried for as long as a running job can wait.
  void write(const std::string& key, const std::string& value);

  // The watcher thread's, on a client of its own: round n's keys and round n+1's joins.
  void watch_round(int64_t round, int64_t from_revision);
  // The io thread's.
  void take(const etcd::WatchEvent& event);
  void take_message(const std::string& node, const AgentMessage& message);
  void stop_once(const PeerStop& stop);
  /// The round ended: a restart needs every node, so one that finished closes the job.
  void round_ended();
  void stop_threads();

  boost::asio::io_context& io_;
  etcd::Settings cluster_;
  std::string job_;
  std::string prefix_;
  etcd::Client client_;  ///< The worker thread's.
  int64_t lease_ = 0;    ///< Granted by the worker thread before it answers a join.
  Clock::time_point next_keep_alive_;
  bool keep_alive_failing_ = false;
  int64_t last_round_ = -1;  ///< The worker's: the round this node last took part in; -1: none.
  bool job_done_ = false;    ///< The worker's: every node of the round finished.

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  bool busy_ = false;  ///< The worker runs a task.
  std::atomic<bool> stopping_ = false;
  std::thread worker_, watcher_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);

  // The io thread's view of the running round.
  std::optional<Expected<Formed>> joined_;  ///< The worker's answer to join().
  std::optional<Formed> formed_;
  std::string node_;
  std::string local_address_;
  PeerEvents events_;
  bool stopped_ = false;
  bool ended_ = false;
  std::set<std::string> done_nodes_;
  std::map<std::string, std::set<int>> barriers_;
  int64_t next_event_ = 0;
  bool failure_reported_ = false, failure_noted_ = false, done_written_ = false;
  std::optional<std::string> job_closed_;
};

}  // namespace mcprun
