#include "launcher/rendezvous/etcd_rendezvous.hpp"

#include <fmt/format.h>

#include <boost/asio/post.hpp>
#include <utility>

#include "common/event_loop.hpp"
#include "common/exit_status.hpp"
#include "common/logging.hpp"
#include "launcher/rendezvous/rendezvous_client.hpp"

namespace mcprun {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;

/// "4", or "2..4" for an elastic job.
std::string node_count(const JoinMessage& join) {
  return join.min_nodes == join.max_nodes ? std::to_string(join.max_nodes)
                                          : fmt::format("{}..{}", join.min_nodes, join.max_nodes);
}

/// Why `job` cannot restart: `done` finished, and a restart needs every node (rendezvousd's words).
std::string closed_message(const std::string& job, const std::set<std::string>& done) {
  std::string names;
  for (const std::string& name : done) names += (names.empty() ? "" : ", ") + name;
  return "job " + job + " cannot restart: node(s) " + names +
         " finished with every worker's success, and a restart needs every node";
}

/// A round's number in its keys: fixed width, so that key order is round order.
std::string round_text(int64_t round) { return fmt::format("{:08d}", round); }

/// Pauses between retries of a request that failed while etcd elects a leader or the client moves.
constexpr milliseconds kRetryPause{200};

/// The time left until `deadline`, at most `cap`, at least 1 ms.
milliseconds until(Clock::time_point deadline, milliseconds cap) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
  return std::clamp(left, milliseconds(1), cap);
}

json node_json(const JoinMessage& join) {
  return {{"node", join.node},           {"addr", join.addr},
          {"nproc", join.nproc},         {"master_port", join.master_port},
          {"node_rank", join.node_rank}, {"labels", join.labels},
          {"gpus", join.gpus.size()}};
}

/// A join key's NodeInfo; nullopt for a value no mcprun wrote.
std::optional<NodeInfo> parse_node(const std::string& value) {
  const json node = json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (!node.is_object()) return std::nullopt;
  try {
    NodeInfo info;
    info.node = node.at("node").get<std::string>();
    info.addr = node.at("addr").get<std::string>();
    info.nproc = node.at("nproc").get<int>();
    info.master_port = node.at("master_port").get<int>();
    info.requested_rank = node.at("node_rank").get<int>();
    info.labels = node.at("labels").get<std::map<std::string, std::string>>();
    info.gpu_count = node.at("gpus").get<int>();
    return info;
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

/// The result key's value: each node's group rank, rank offset and workers, and the master.
json result_json(const RoundResult& result) {
  json nodes = json::object();
  for (const NodeAssignment& node : result.nodes)
    nodes[node.node] = {node.group_rank, node.rank_offset, node.nproc};
  return {{"world_size", result.world_size},
          {"master_addr", result.master_addr},
          {"master_port", result.master_port},
          {"nodes", nodes}};
}

/// The text after `prefix` in `key`, or nullopt when `key` does not start with it.
std::optional<std::string_view> after(std::string_view key, std::string_view prefix) {
  if (!key.starts_with(prefix)) return std::nullopt;
  return key.substr(prefix.size());
}

/// A round's number from a key under "r/": nullopt when it has none.
std::optional<int64_t> round_of(std::string_view rest) {
  const auto slash = rest.find('/');
  if (slash == std::string_view::npos || slash == 0) return std::nullopt;
  int64_t round = 0;
  for (char c : rest.substr(0, slash)) {
    if (c < '0' || c > '9') return std::nullopt;
    round = round * 10 + (c - '0');
  }
  return round;
}

}  // namespace

std::string etcd_job_prefix(const std::string& job) {
  std::string escaped;
  for (char c : job) escaped += c == '/' ? "%2F" : c == '%' ? "%25" : std::string(1, c);
  return "/mcprun/" + escaped + "/";
}

namespace {

/// The keys of one job's rounds.
struct RoundKeys {
  std::string prefix;  ///< The job's.
  std::string rounds() const { return prefix + "r/"; }
  std::string round(int64_t n) const { return rounds() + round_text(n) + "/"; }
  std::string nodes(int64_t n) const { return round(n) + "node/"; }
  std::string node(int64_t n, const std::string& name) const { return nodes(n) + name; }
  std::string result(int64_t n) const { return round(n) + "result"; }
  std::string end(int64_t n) const { return round(n) + "end"; }
  std::string done(int64_t n) const { return round(n) + "done/"; }
  std::string events(int64_t n) const { return round(n) + "event/"; }
  std::string placed(int64_t n) const { return prefix + "placed/" + round_text(n) + "/"; }
};

}  // namespace

EtcdRendezvous::EtcdRendezvous(boost::asio::io_context& io, etcd::Settings cluster, std::string job,
                               std::unique_ptr<EtcdRendezvous> previous_round)
    : io_(io),
      cluster_(cluster),
      job_(std::move(job)),
      prefix_(etcd_job_prefix(job_)),
      client_(std::move(cluster)) {
  if (previous_round) {
    previous_round->stop_threads();
    lease_ = std::exchange(previous_round->lease_, 0);  // Its keys stay until the job ends.
    last_round_ = previous_round->last_round_;
    next_keep_alive_ = previous_round->next_keep_alive_;
  }
  worker_ = std::thread([this] { run_tasks(); });
}

EtcdRendezvous::~EtcdRendezvous() {
  stop_threads();
  // A node that finished while others run keeps its keys for the lease's TTL: a node that fails
  // after it learns from them that the job cannot restart.
  if (lease_ && done_written_ && !job_done_) {
    spdlog::debug("etcd: this node's keys stay for {} s, for the nodes still running",
                  kEtcdLeaseTtl.count());
  } else if (lease_) {
    if (auto revoked = client_.revoke(lease_); !revoked)
      spdlog::warn("etcd: this node's keys stay until its lease expires ({} s): {}",
                   kEtcdLeaseTtl.count(), revoked.error().message);
  }
  alive_.reset();
}

void EtcdRendezvous::stop_threads() {
  {
    // What this node told the others leaves first, within the time a report may take.
    std::unique_lock lock(mutex_);
    wake_.wait_for(lock, kReportFlushTimeout, [&] { return tasks_.empty() && !busy_; });
    stopping_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (watcher_.joinable()) watcher_.join();
}

void EtcdRendezvous::enqueue(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  wake_.notify_all();
}

void EtcdRendezvous::post(std::function<void(EtcdRendezvous&)> task) {
  boost::asio::post(io_, [this, alive = std::weak_ptr<bool>(alive_), task = std::move(task)] {
    if (alive.lock()) task(*this);
  });
}

void EtcdRendezvous::run_tasks() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      // Between tasks, the lease is kept alive on time.
      wake_.wait_until(lock, lease_ ? next_keep_alive_ : Clock::now() + kEtcdLeaseTtl,
                       [&] { return stopping_ || !tasks_.empty(); });
      if (stopping_) return;
      if (!tasks_.empty()) {
        task = std::move(tasks_.front());
        tasks_.pop_front();
        busy_ = true;
      }
    }
    keep_alive_if_due();
    if (!task) continue;
    task();
    {
      std::lock_guard lock(mutex_);
      busy_ = false;
    }
    wake_.notify_all();
  }
}

void EtcdRendezvous::keep_alive_if_due() {
  if (!lease_ || Clock::now() < next_keep_alive_) return;
  auto ttl = client_.keep_alive(lease_);
  // Kept on time, or tried again soon while no member answers.
  next_keep_alive_ = Clock::now() + (ttl ? kEtcdLeaseTtl / 3 : kEtcdLeaseTtl / 10);
  if (!ttl) {
    if (!std::exchange(keep_alive_failing_, true))
      spdlog::warn("etcd: cannot renew this node's lease; the workers run on: {}",
                   ttl.error().message);
    return;
  }
  if (std::exchange(keep_alive_failing_, false)) spdlog::info("etcd: lease renewed again");
  if (*ttl > 0) return;
  post([](EtcdRendezvous& self) {
    self.stop_once(
        {"this node's etcd lease expired: the other nodes count it lost", kExitRendezvous});
  });
}

template <class Call>
auto EtcdRendezvous::retrying(Clock::time_point deadline, Call call) -> decltype(call()) {
  for (bool warned = false;; warned = true) {
    auto answer = call();
    if (answer || stopping_ || Clock::now() + kRetryPause >= deadline) return answer;
    // A client whose TLS files cannot be read will not read them on the next try either.
    if (answer.error().message.starts_with("TLS for etcd")) return answer;
    if (!warned) spdlog::warn("etcd: {}; trying again", answer.error().message);
    std::this_thread::sleep_for(kRetryPause);
    keep_alive_if_due();
  }
}

Expected<Assignment> EtcdRendezvous::join(JoinMessage join, std::chrono::milliseconds limit) {
  const Clock::time_point deadline = Clock::now() + limit;
  node_ = join.node;
  enqueue([this, join, deadline] {
    auto formed = form_round(join, deadline);
    post([formed = std::move(formed)](EtcdRendezvous& self) { self.joined_ = formed; });
  });
  // The worker answers by the deadline: each of its requests is bounded, and it checks between.
  const bool answered = run_until(
      io_, [&] { return joined_.has_value(); }, limit + cluster_.request_timeout * 2);
  if (!answered)
    return Error{fmt::format("etcd: no rendezvous assignment within {} s", limit.count() / 1000)};
  Expected<Formed> formed = std::move(*joined_);
  joined_.reset();
  if (!formed) return formed.error();
  local_address_ = formed->local_address;
  formed_ = std::move(*formed);
  return formed_->assignment;
}

Expected<EtcdRendezvous::Formed> EtcdRendezvous::form_round(JoinMessage join,
                                                            Clock::time_point deadline) {
  const RoundKeys keys{prefix_};
  if (!lease_) {
    auto lease = retrying(deadline, [&] { return client_.grant_lease(kEtcdLeaseTtl); });
    if (!lease) return Error{"etcd: " + lease.error().message};
    lease_ = *lease;
    next_keep_alive_ = Clock::now() + kEtcdLeaseTtl / 3;
  }
  for (;;) {
    auto round = choose_round(join, deadline);
    if (!round) return round.error();
    // Where this node reached etcd from: the address the others reach it at.
    if (join.addr.empty()) join.addr = client_.local_address();
    const std::string me = node_json(join).dump();
    auto created = retrying(
        deadline, [&] { return client_.create(keys.node(*round, join.node), me, lease_); });
    if (!created) return Error{"etcd: " + created.error().message};
    if (!created->succeeded && created->current && created->current->lease != lease_)
      return Error{
          fmt::format("rendezvous: node name {} is taken in job {}: name each node "
                      "apart (--node-name)",
                      join.node, job_)};
    auto formed = await_result(*round, join, deadline);
    if (!formed || !*formed) {
      // Out of this round: the nodes that form it must not count this node in.
      (void)client_.erase(keys.node(*round, join.node));
      if (!formed) return formed.error();
      continue;
    }
    // The round runs from now on: a node that comes later asks to join the next one.
    auto placed = retrying(
        deadline, [&] { return client_.put(keys.placed(*round) + join.node, "", lease_); });
    if (!placed) return Error{"etcd: " + placed.error().message};
    last_round_ = *round;
    (*formed)->local_address = join.addr;
    return std::move(**formed);
  }
}

Expected<int64_t> EtcdRendezvous::choose_round(const JoinMessage& join,
                                               Clock::time_point deadline) {
  const RoundKeys keys{prefix_};
  const int64_t floor = last_round_ + 1;  // Never back into a round this node has left.
  if (join.restart_count > 0 && last_round_ >= 0) {
    // A restart needs every node: one that finished closes the job (as rendezvousd says).
    auto done = retrying(deadline, [&] {
      return client_.range_prefix(keys.done(last_round_), nullptr, {.keys_only = true});
    });
    if (!done) return Error{"etcd: " + done.error().message};
    if (!done->empty()) {
      std::set<std::string> names;
      for (const etcd::KeyValue& kv : *done)
        names.insert(kv.key.substr(keys.done(last_round_).size()));
      std::string closed = closed_message(job_, names);
      post([closed](EtcdRendezvous& self) { self.job_closed_ = closed; });
      return Error{"rendezvous: " + closed};
    }
  }
  auto highest = retrying(deadline, [&] {
    return client_.range_prefix(
        keys.rounds(), nullptr,
        {.order = etcd::RangeOptions::Order::kKeyDescending, .limit = 1, .keys_only = true});
  });
  if (!highest) return Error{"etcd: " + highest.error().message};
  if (highest->empty()) return floor;
  const auto round = round_of(highest->front().key.substr(keys.rounds().size()));
  if (!round || *round < floor) return floor;
  auto placed = retrying(deadline, [&] { return client_.count_prefix(keys.placed(*round)); });
  if (!placed) return Error{"etcd: " + placed.error().message};
  if (*placed == 0) return *round;  // Forming: join it.
  auto ended = retrying(deadline, [&] { return client_.get(keys.end(*round)); });
  if (!ended) return Error{"etcd: " + ended.error().message};
  auto done = retrying(deadline, [&] { return client_.count_prefix(keys.done(*round)); });
  if (!done) return Error{"etcd: " + done.error().message};
  if (!*ended && *done < *placed && *placed >= join.max_nodes)
    return Error{
        fmt::format("rendezvous: job {} is running with all {} nodes; it admits no new node", job_,
                    join.max_nodes)};
  // Running (the newcomer opens the next round, and the running nodes re-form into it, as
  // torchrun does when nodes wait), or ended, or finished by every node.
  return *round + 1;
}

Expected<std::optional<EtcdRendezvous::Formed>> EtcdRendezvous::await_result(
    int64_t round, const JoinMessage& join, Clock::time_point deadline) {
  const RoundKeys keys{prefix_};
  while (!stopping_) {
    auto result = retrying(deadline, [&] { return client_.get(keys.result(round)); });
    if (!result) return Error{"etcd: " + result.error().message};
    if (*result) return take_result(round, **result, join.node);
    int64_t revision = 0;
    auto first = retrying(deadline, [&] {
      return client_.range_prefix(
          keys.nodes(round), &revision,
          {.order = etcd::RangeOptions::Order::kCreatedFirst, .limit = 1, .keys_only = true});
    });
    if (!first) return Error{"etcd: " + first.error().message};
    if (!first->empty() && first->front().key == keys.node(round, join.node))
      return conduct(round, join, deadline);
    if (Clock::now() >= deadline) {
      auto joined = client_.count_prefix(keys.nodes(round));
      return Error{
          fmt::format("rendezvous: job {}'s round formed no assignment in time: {} of "
                      "{} nodes joined",
                      job_, joined ? *joined : 0, node_count(join))};
    }
    // The conductor publishes the result; a conductor that died leaves its place to the next.
    auto seen = client_.watch_range(keys.result(round), "", revision + 1,
                                    until(deadline, kEtcdLeaseTtl / 3));
    keep_alive_if_due();
    if (!seen) std::this_thread::sleep_for(kRetryPause);
  }
  return Error{"etcd: stopped while joining"};
}

Expected<std::optional<EtcdRendezvous::Formed>> EtcdRendezvous::conduct(
    int64_t round, const JoinMessage& join, Clock::time_point deadline) {
  const RoundKeys keys{prefix_};
  RoundSettings settings;
  settings.min_nodes = join.min_nodes;
  settings.max_nodes = join.max_nodes;
  settings.join_timeout = milliseconds(static_cast<long>(1000 * join.join_timeout_s));
  settings.last_call_timeout = milliseconds(static_cast<long>(1000 * join.last_call_timeout_s));
  RendezvousRound forming(settings, Clock::now());
  auto take_join = [&](const etcd::KeyValue& kv) {
    const auto info = parse_node(kv.value);
    if (!info) return spdlog::warn("etcd: ignoring {}: not a node's join", kv.key);
    if (auto refused = forming.join(*info, Clock::now()))
      spdlog::warn("job {}: {} cannot join round {}: {}", job_, info->node, round, *refused);
  };
  int64_t revision = 0;
  auto joined = retrying(deadline, [&] {
    return client_.range_prefix(keys.nodes(round), &revision,
                                {.order = etcd::RangeOptions::Order::kCreatedFirst});
  });
  if (!joined) return Error{"etcd: " + joined.error().message};
  for (const etcd::KeyValue& kv : *joined) take_join(kv);
  size_t shown = 0;
  while (!stopping_) {
    switch (forming.advance(Clock::now())) {
      case RendezvousRound::State::kComplete:
      case RendezvousRound::State::kTimedOut: {
        const bool complete = forming.state() == RendezvousRound::State::kComplete;
        const json value =
            complete ? result_json(forming.result()) : json{{"error", forming.timeout_message()}};
        auto created = retrying(
            deadline, [&] { return client_.create(keys.result(round), value.dump(), lease_); });
        if (!created) return Error{"etcd: " + created.error().message};
        if (!created->succeeded && created->current)
          return take_result(round, *created->current, join.node);
        etcd::KeyValue published{
            keys.result(round), value.dump(), created->revision, created->revision, 1, lease_};
        if (complete)
          spdlog::info("job {}: round {} complete, {} nodes, world size {}", job_, round,
                       forming.result().nodes.size(), forming.result().world_size);
        return take_result(round, published, join.node);
      }
      case RendezvousRound::State::kJoining:
        break;
    }
    if (forming.joined() != shown)
      spdlog::info("job {}: {} of {} nodes joined round {}", job_, shown = forming.joined(),
                   node_count(join), round);
    auto seen =
        client_.watch_prefix(keys.nodes(round), revision + 1,
                             until(std::min(forming.next_deadline(), deadline), kEtcdLeaseTtl / 3));
    keep_alive_if_due();
    if (!seen) {
      std::this_thread::sleep_for(kRetryPause);
      continue;
    }
    revision = std::max(revision, seen->revision);
    for (const etcd::WatchEvent& event : seen->events) {
      if (event.type == etcd::WatchEvent::Type::kDelete)
        forming.leave(event.kv.key.substr(keys.nodes(round).size()));
      else if (event.kv.version == 1)  // A join, not a rewrite.
        take_join(event.kv);
    }
  }
  return Error{"etcd: stopped while joining"};
}

Expected<std::optional<EtcdRendezvous::Formed>> EtcdRendezvous::take_result(
    int64_t round, const etcd::KeyValue& result, const std::string& node) {
  const json value = json::parse(result.value, nullptr, /*allow_exceptions=*/false);
  if (!value.is_object()) return Error{"etcd: " + result.key + " holds no round"};
  if (value.contains("error"))
    return Error{"rendezvous: " + value.value("error", std::string("the round timed out"))};
  try {
    Formed formed;
    formed.round = round;
    formed.revision = result.mod_revision;
    const json& nodes = value.at("nodes");
    for (const auto& [name, place] : nodes.items()) formed.nodes.insert(name);
    if (!nodes.contains(node)) return std::optional<Formed>();  // It completed without us.
    const json& place = nodes.at(node);
    formed.assignment = Assignment{place.at(0).get<int>(),
                                   static_cast<int>(nodes.size()),
                                   value.at("world_size").get<int>(),
                                   place.at(1).get<int>(),
                                   value.at("master_addr").get<std::string>(),
                                   value.at("master_port").get<int>()};
    return std::optional<Formed>(std::move(formed));
  } catch (const json::exception& bad) {
    return Error{"etcd: " + result.key + " holds no round: " + bad.what()};
  }
}

void EtcdRendezvous::watch(PeerEvents events) {
  events_ = std::move(events);
  if (!formed_) return;
  watcher_ = std::thread(
      [this, round = formed_->round, from = formed_->revision + 1] { watch_round(round, from); });
}

void EtcdRendezvous::watch_round(int64_t round, int64_t from_revision) {
  const RoundKeys keys{prefix_};
  etcd::Client client(cluster_);
  // Round n's keys, and the joins into round n+1 (which sort after round n's).
  const std::string first = keys.round(round);
  const std::string end = etcd::prefix_range_end(keys.nodes(round + 1));
  bool failing = false;
  while (!stopping_) {
    auto seen = client.watch_range(first, end, from_revision, kEtcdWatchRenewal);
    if (!seen) {
      if (!std::exchange(failing, true))
        spdlog::warn("etcd: cannot hear the other nodes; the workers run on: {}",
                     seen.error().message);
      std::this_thread::sleep_for(kRetryPause);
      continue;
    }
    if (std::exchange(failing, false)) spdlog::info("etcd: hearing the other nodes again");
    from_revision = std::max(from_revision, seen->revision + 1);
    if (!seen->events.empty())
      post([events = std::move(seen->events)](EtcdRendezvous& self) {
        for (const etcd::WatchEvent& event : events) self.take(event);
      });
  }
}

void EtcdRendezvous::take(const etcd::WatchEvent& event) {
  const RoundKeys keys{prefix_};
  const int64_t round = formed_->round;
  const bool put = event.type == etcd::WatchEvent::Type::kPut;
  const std::string_view key = event.kv.key;
  if (auto joiner = after(key, keys.nodes(round + 1))) {
    if (put && event.kv.version == 1 && *joiner != node_)
      stop_once({"node " + std::string(*joiner) + " joins the job; re-forming the round",
                 kExitRendezvous, true});
    return;
  }
  if (auto done = after(key, keys.done(round))) {
    if (put) done_nodes_.insert(std::string(*done));
    return;
  }
  if (auto node = after(key, keys.nodes(round))) {
    const std::string name(*node);
    if (put || ended_ || name == node_ || !formed_->nodes.contains(name) ||
        done_nodes_.contains(name))
      return;
    stop_once({"node " + name + " was lost (its etcd lease expired: it stopped answering)",
               kExitRendezvous});
    enqueue([this, round, name] { write(RoundKeys{prefix_}.end(round), "lost: " + name); });
    return round_ended();
  }
  if (auto event_key = after(key, keys.events(round)); event_key && put) {
    const std::string sender(event_key->substr(0, event_key->rfind('/')));
    auto message = decode_agent_message(json::parse(event.kv.value, nullptr, false));
    if (!message)
      return spdlog::error("etcd: {} holds a message this node cannot use ({}); ignoring it",
                           event.kv.key, message.error().message);
    take_message(sender, *message);
  }
}

void EtcdRendezvous::take_message(const std::string& node, const AgentMessage& message) {
  // Every node's barrier arrivals count, this node's own included; the rest is the others'.
  if (const auto* arrival = std::get_if<BarrierArrival>(&message)) {
    std::set<int>& arrived = barriers_[arrival->name];
    arrived.insert(arrival->rank);
    if (static_cast<int>(arrived.size()) < formed_->assignment.world_size) return;
    barriers_.erase(arrival->name);
    if (events_.on_barrier_done) events_.on_barrier_done(arrival->name);
    return;
  }
  if (node == node_) return;
  std::visit(MessageHandlers{[&](const FailedNotice& failed) {
                               round_ended();
                               stop_once({"node " + node + ": " + failed.reason, failed.exit_code,
                                          false, failed.preflight});
                             },
                             [&](const StallMessage& stall) {
                               round_ended();
                               json body = stall.body;
                               body["node"] = node;
                               if (events_.on_stall) events_.on_stall(body);
                             },
                             [&](const StallReportMessage& report) {
                               if (events_.on_stall_report)
                                 events_.on_stall_report(node, report.ranks);
                             },
                             [&](const StragglerMessage& straggler) {
                               if (events_.on_straggler) events_.on_straggler(straggler.line);
                             },
                             [](const auto&) {}},
             message);
}

void EtcdRendezvous::stop_once(const PeerStop& stop) {
  if (std::exchange(stopped_, true) || !events_.on_stop) return;
  events_.on_stop(stop);
}

void EtcdRendezvous::round_ended() {
  ended_ = true;
  if (done_nodes_.empty()) return;
  job_closed_ = closed_message(job_, done_nodes_);
}

void EtcdRendezvous::write(const std::string& key, const std::string& value) {
  // A running job waits for etcd as long as a rendezvousd agent waits to reconnect.
  auto written =
      retrying(Clock::now() + kReconnectTimeout, [&] { return client_.put(key, value, lease_); });
  if (!written)
    spdlog::error("etcd: {} not written, the other nodes will not hear it: {}", key,
                  written.error().message);
}

void EtcdRendezvous::send(const AgentMessage& message) {
  if (!formed_) return;
  const std::string key = RoundKeys{prefix_}.events(formed_->round) + node_ + "/" +
                          fmt::format("{:010d}", next_event_++);
  enqueue([this, key, value = encode(message).dump()] { write(key, value); });
}

void EtcdRendezvous::report_failure(const std::string& reason, int exit_code,
                                    nlohmann::json preflight) {
  if (!formed_) return;
  round_ended();
  stopped_ = failure_reported_ = true;  // The others restart without telling this node to.
  send(FailedNotice{"", reason, exit_code, std::move(preflight)});
  const RoundKeys keys{prefix_};
  const int64_t round = formed_->round;
  enqueue([this, keys, round, reason] {
    write(keys.end(round), "failed: " + reason);
    // The nodes that finished before this failure was written: they close the job.
    auto done = client_.range_prefix(keys.done(round), nullptr, {.keys_only = true});
    std::set<std::string> names;
    if (done)
      for (const etcd::KeyValue& kv : *done) names.insert(kv.key.substr(keys.done(round).size()));
    post([names](EtcdRendezvous& self) {
      self.done_nodes_.insert(names.begin(), names.end());
      self.round_ended();
      self.failure_noted_ = true;
    });
  });
  run_until(
      io_, [&] { return failure_noted_; }, kReportFlushTimeout);
}

void EtcdRendezvous::await_failure_noted(std::chrono::milliseconds limit) {
  if (failure_reported_)
    run_until(
        io_, [&] { return failure_noted_; }, limit);
}

void EtcdRendezvous::report_done() {
  if (!formed_) return;
  stopped_ = true;
  const std::string key = RoundKeys{prefix_}.done(formed_->round) + node_;
  const RoundKeys keys{prefix_};
  const int64_t round = formed_->round;
  const auto nodes = static_cast<int64_t>(formed_->nodes.size());
  enqueue([this, key, keys, round, nodes] {
    write(key, "");
    // The last node to finish clears the job: every node's keys, those kept for a late failure.
    auto done = client_.count_prefix(keys.done(round));
    if (done && *done >= nodes) {
      job_done_ = true;
      (void)client_.delete_prefix(prefix_);
    }
    post([](EtcdRendezvous& self) { self.done_written_ = true; });
  });
  run_until(
      io_, [&] { return done_written_; }, kReportFlushTimeout);
}

}  // namespace mcprun
