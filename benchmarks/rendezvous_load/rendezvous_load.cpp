// rendezvous_load: thousands of simulated mcprun agents in one process, one connection each,
// speaking rendezvousd's protocol (common/protocol.hpp) in its own encoding.
// scripts/bench-rendezvous drives it; tests/e2e/test_scale.py runs it against a real rendezvousd.
//
// Usage: rendezvous_load --port PORT [--host 127.0.0.1] [--timeout SECONDS] [--sources 64]
//
// Against a loopback daemon the agents connect from --sources loopback addresses (127.0.0.1 up),
// as a job's agents come from many hosts (see load_generator::open_from).
//
// Commands come one a line on stdin and run one at a time; each answers one JSON line on stdout:
//   connect N       N agents connect at once. {"phase", "seconds" (null past the timeout),
//                   "agents", "connected", "errors", "first_error"}
//   join JOBS       the connected agents that have not joined yet split into JOBS jobs of equal
//                   size, each with a new id; every join frame is written at once, the jobs'
//                   interleaved (agent i of job 0, agent i of job 1, ...), as their nodes start
//                   together; then each agent reads frames until its assignment. The frames are
//                   kept raw and parsed once the clock has stopped, so that the time is the
//                   daemon's. {"phase", "jobs": [{"job", "agents", "seconds" (from the first join
//                   written to the job's last assignment received; null past the timeout),
//                   "assigned", "errors", "waiting" (still unanswered at the timeout), "ok" (every
//                   agent assigned, group ranks exactly 0..n-1, world size n), "first_error" (an
//                   error frame, a socket error or an assignment without its numbers),
//                   "heartbeat_interval_ms" (the largest an assignment carried)}]}
//   idle SECONDS    every assigned agent heartbeats at the interval its assignment told it, spread
//                   evenly over it (agent k of N first at k * interval / N), for SECONDS; answered
//                   at the end. {"phase", "seconds", "agents", "heartbeats", "lost" (assigned
//                   agents whose connection the daemon closed, at any time since the assignment),
//                   "first_lost"}. A caller measures the daemon beside it: scripts/bench-rendezvous
//                   reads the daemon's CPU a third of the way in and again on the answer.
// Agents are silent outside idle: the daemon's lease (15 s by default) outlasts a join. Frames
// outside a join are read and dropped. A bad command answers {"error": ...}. The end of stdin
// closes every connection and ends the program.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "load_generator.hpp"

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace rendezvous_load {
namespace {

/// The daemon's cap on a frame's payload (common/protocol.hpp's kMaxFrameBytes).
constexpr uint32_t kMaxFrameBytes = 64 * 1024;
constexpr size_t kFrameHeaderBytes = 4;
/// Room each read asks for: a joined frame and an assignment fit in one.
constexpr size_t kReadChunk = 1024;

/// A frame: the payload's length, big-endian, then the payload.
std::string frame(const json& message) {
  const std::string payload = message.dump();
  const auto length = static_cast<uint32_t>(payload.size());
  std::string bytes{static_cast<char>(length >> 24), static_cast<char>(length >> 16),
                    static_cast<char>(length >> 8), static_cast<char>(length)};
  return bytes + payload;
}

/// A join as mcprun's agent sends it, for one node of a job of `size` with one worker.
std::string join_frame(const std::string& job, size_t node, size_t size) {
  return frame({{"v", 1},
                {"type", "join"},
                {"job", job},
                {"node", "a" + std::to_string(node)},
                {"addr", "127.0.0.1"},
                {"nproc", 1},
                {"master_port", 0},
                {"node_rank", -1},
                {"labels", json::object()},
                {"min_nodes", size},
                {"max_nodes", size},
                {"join_timeout_s", 120},
                {"last_call_timeout_s", 5},
                // As an agent in a batch job, whose stderr is no terminal, joins.
                {"progress", false}});
}

const std::string kHeartbeat = frame({{"v", 1}, {"type", "heartbeat"}});

/// A frame's "type" without parsing the rest: a JSON string cannot hold an unescaped quote, so
/// `"type":"` is a key wherever it occurs (the daemon writes no spaces).
std::string_view frame_type(std::string_view payload) {
  constexpr std::string_view key = R"("type":")";
  const size_t start = payload.find(key);
  if (start == std::string_view::npos) return {};
  const size_t from = start + key.size();
  const size_t end = payload.find('"', from);
  return end == std::string_view::npos ? std::string_view{} : payload.substr(from, end - from);
}

/// One simulated agent: its connection, what it has read and written, and its assignment.
struct Agent {
  explicit Agent(asio::io_context& io) : socket(io) {}
  tcp::socket socket;
  std::string inbox;  ///< Bytes read that do not make a whole frame yet.
  std::string writing, queued;
  bool connected = false;
  bool closed = false;         ///< Never used again: closed here, or by the daemon.
  std::string closed_because;  ///< Why, when the daemon's side ended it.
  bool owes = false;           ///< Still owes the running command its end.
  bool joined = false;         ///< Has sent its join; a later join command leaves it out.
  size_t job = 0;              ///< Its job in the running join command.
  std::string assignment;      ///< The assignment's raw payload, parsed after the clock.
  Clock::time_point assigned_at;
  std::chrono::milliseconds heartbeat_interval{0};  ///< As its assignment told; zero: none.
};

/// One job of a join command.
struct Job {
  std::string id;
  std::vector<size_t> agents;  ///< Indices into the generator's agents, node i at [i].
  size_t errors = 0;
  std::optional<std::string> first_error;
};

/// The agents and the one command they run at a time.
class LoadGenerator {
 public:
  using Report = std::function<void(const json&)>;

  LoadGenerator(asio::io_context& io, tcp::endpoint server, size_t sources,
                std::chrono::milliseconds timeout)
      : io_(io),
        server_(server),
        sources_(sources),
        timeout_(timeout),
        deadline_(io),
        heartbeat_timer_(io) {}

  /// Runs one command line; `report` hears its answer once it ends.
  void run(const std::string& line, Report report) {
    std::istringstream words(line);
    std::string command, argument;
    words >> command >> argument;
    if (command == "connect") {
      if (auto count = whole_number(argument)) return connect(*count, std::move(report));
    } else if (command == "join") {
      if (auto jobs = whole_number(argument); jobs && *jobs > 0)
        return join(*jobs, std::move(report));
    } else if (command == "idle") {
      char* end = nullptr;
      const double seconds = std::strtod(argument.c_str(), &end);
      if (!argument.empty() && *end == '\0' && seconds > 0 && seconds < 1e6)
        return idle(seconds, std::move(report));
    }
    report({{"error", "not a command: '" + line + "' (connect N, join JOBS, idle SECONDS)"}});
  }

  void close_all() {
    for (auto& agent : agents_) close(*agent);
  }

 private:
  static std::optional<size_t> whole_number(const std::string& text) {
    size_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
    return value;
  }

  /// Starts a command over `owing` agents: it ends when each has settled, or at the deadline.
  void begin(std::string phase, Report report, size_t owing, Clock::duration limit) {
    phase_ = std::move(phase);
    report_ = std::move(report);
    outstanding_ = owing;
    start_ = Clock::now();
    deadline_.expires_after(limit);
    deadline_.async_wait([this](boost::system::error_code ec) {
      if (!ec) end(false);
    });
  }

  /// One agent is through the command (or failed in it).
  void settle(Agent& agent) {
    if (!agent.owes) return;
    agent.owes = false;
    if (--outstanding_ == 0) end(true);
  }

  /// Answers the command; past the deadline, the agents still in it are closed, so that nothing
  /// of it runs into the next command.
  void end(bool in_time) {
    if (!report_) return;
    const Clock::time_point ended = Clock::now();
    deadline_.cancel();
    heartbeat_timer_.cancel();
    for (auto& agent : agents_) {
      if (!agent->owes) continue;
      close(*agent);
    }
    json answer;
    if (phase_ == "connect")
      answer = connect_answer(ended, in_time);
    else if (phase_ == "join")
      answer = join_answer();
    else
      answer = idle_answer(ended);
    for (auto& agent : agents_) agent->owes = false;
    auto report = std::move(report_);
    report_ = nullptr;
    report(answer);
  }

  void close(Agent& agent) {
    agent.closed = true;
    boost::system::error_code ignored;
    agent.socket.close(ignored);
  }

  /// The daemon's side ended the connection, or a write or read on it failed.
  void broken(Agent& agent, std::string why) {
    if (agent.closed) return;  // Closed here: the aborted operation is ours, not the daemon's.
    close(agent);
    agent.closed_because = std::move(why);
    if (agent.owes && phase_ == "join") job_error(jobs_[agent.job], agent.closed_because);
    if (agent.owes && phase_ == "connect") connect_error(agent.closed_because);
    settle(agent);
  }

  void send(Agent& agent, std::string bytes) {
    if (agent.closed) return;
    if (!agent.writing.empty()) {
      agent.queued += bytes;
      return;
    }
    agent.writing = std::move(bytes);
    asio::async_write(agent.socket, asio::buffer(agent.writing),
                      [this, &agent](boost::system::error_code ec, size_t) {
                        if (ec) return broken(agent, "write: " + ec.message());
                        agent.writing.clear();
                        if (!agent.queued.empty()) send(agent, std::exchange(agent.queued, {}));
                      });
  }

  /// Reads frames for as long as the connection lasts.
  void read(Agent& agent) {
    const size_t held = agent.inbox.size();
    agent.inbox.resize(held + kReadChunk);
    agent.socket.async_read_some(
        asio::buffer(agent.inbox.data() + held, kReadChunk),
        [this, &agent, held](boost::system::error_code ec, size_t got) {
          if (ec == asio::error::eof) return broken(agent, "the daemon closed the connection");
          if (ec) return broken(agent, "read: " + ec.message());
          agent.inbox.resize(held + got);
          size_t used = 0;
          while (agent.inbox.size() - used >= kFrameHeaderBytes) {
            const auto* header = reinterpret_cast<const unsigned char*>(agent.inbox.data() + used);
            const uint32_t length = uint32_t{header[0]} << 24 | uint32_t{header[1]} << 16 |
                                    uint32_t{header[2]} << 8 | uint32_t{header[3]};
            if (length > kMaxFrameBytes)
              return broken(agent, "a frame of " + std::to_string(length) + " bytes");
            if (agent.inbox.size() - used - kFrameHeaderBytes < length) break;
            on_frame(agent, std::string_view(agent.inbox).substr(used + kFrameHeaderBytes, length));
            if (agent.closed) return;
            used += kFrameHeaderBytes + length;
          }
          agent.inbox.erase(0, used);
          read(agent);
        });
  }

  void on_frame(Agent& agent, std::string_view payload) {
    if (!agent.owes || phase_ != "join") return;  // Outside a join: dropped.
    const std::string_view type = frame_type(payload);
    if (type == "assignment") {
      agent.assigned_at = Clock::now();
      agent.assignment = payload;
      return settle(agent);
    }
    if (type == "joined" || type == "progress") return;
    job_error(jobs_[agent.job], std::string(payload));
    settle(agent);
  }

  // ------------------------------------------------------------------ connect

  void connect(size_t count, Report report) {
    connect_errors_ = 0;
    connect_first_error_.reset();
    connect_from_ = agents_.size();
    begin("connect", std::move(report), count, timeout_);
    if (count == 0) return end(true);
    for (size_t n = 0; n < count; ++n) {
      agents_.push_back(std::make_unique<Agent>(io_));
      Agent& agent = *agents_.back();
      agent.owes = true;
      if (auto ec =
              load_generator::open_from(agent.socket, server_, sources_, agents_.size() - 1)) {
        broken(agent, "bind: " + ec.message());
        continue;
      }
      agent.socket.async_connect(server_, [this, &agent](boost::system::error_code ec) {
        if (ec) return broken(agent, "connect: " + ec.message());
        agent.socket.set_option(tcp::no_delay(true), ec);  // As mcprun's agent does.
        agent.connected = true;
        read(agent);
        settle(agent);
      });
    }
  }

  void connect_error(const std::string& why) {
    ++connect_errors_;
    if (!connect_first_error_) connect_first_error_ = why;
  }

  json connect_answer(Clock::time_point ended, bool in_time) {
    size_t connected = 0;
    for (size_t i = connect_from_; i < agents_.size(); ++i)
      connected += agents_[i]->connected && !agents_[i]->closed;
    return {
        {"phase", "connect"},
        {"seconds", in_time ? json(std::chrono::duration<double>(ended - start_).count()) : json()},
        {"agents", agents_.size() - connect_from_},
        {"connected", connected},
        {"errors", connect_errors_},
        {"first_error", connect_first_error_ ? json(*connect_first_error_) : json()}};
  }

  // ------------------------------------------------------------------ join

  void join(size_t job_count, Report report) {
    std::vector<size_t> ready;
    for (size_t i = 0; i < agents_.size(); ++i)
      if (agents_[i]->connected && !agents_[i]->closed && !agents_[i]->joined) ready.push_back(i);
    if (ready.empty() || ready.size() % job_count != 0) {
      return report({{"error", std::to_string(ready.size()) + " connected agents that have not " +
                                   "joined do not split into " + std::to_string(job_count) +
                                   " jobs of equal size"}});
    }
    const size_t size = ready.size() / job_count;
    jobs_.assign(job_count, {});
    ++join_commands_;
    for (size_t k = 0; k < job_count; ++k) {
      jobs_[k].id = "load-" + std::to_string(::getpid()) + "-" + std::to_string(join_commands_) +
                    "-" + std::to_string(k);
      jobs_[k].agents.assign(ready.begin() + k * size, ready.begin() + (k + 1) * size);
    }
    // Every frame is encoded before the clock starts.
    std::vector<std::pair<Agent*, std::string>> joins;
    joins.reserve(ready.size());
    for (size_t i = 0; i < size; ++i) {
      for (size_t k = 0; k < job_count; ++k) {
        Agent& agent = *agents_[jobs_[k].agents[i]];
        agent.job = k;
        agent.joined = agent.owes = true;
        joins.emplace_back(&agent, join_frame(jobs_[k].id, i, size));
      }
    }
    begin("join", std::move(report), ready.size(), timeout_);
    for (auto& [agent, bytes] : joins) send(*agent, std::move(bytes));
  }

  void job_error(Job& job, const std::string& why) {
    ++job.errors;
    if (!job.first_error) job.first_error = why;
  }

  /// Judges each job from its agents' raw assignments, now that the clock has stopped.
  json join_answer() {
    json answer{{"phase", "join"}, {"jobs", json::array()}};
    for (Job& job : jobs_) {
      const size_t size = job.agents.size();
      std::vector<bool> ranked(size, false);
      size_t assigned = 0, waiting = 0;
      bool ranks_exact = true;
      std::optional<Clock::time_point> last;
      int64_t interval_ms = 0;
      for (size_t index : job.agents) {
        Agent& agent = *agents_[index];
        if (agent.assignment.empty()) {
          waiting += agent.owes;  // Past the deadline: neither assigned nor failed.
          continue;
        }
        const json message = json::parse(agent.assignment, nullptr, false);
        const auto number = [&](const char* key) -> std::optional<int64_t> {
          auto it = message.find(key);
          if (it == message.end() || !it->is_number_integer()) return std::nullopt;
          return it->get<int64_t>();
        };
        const auto rank = message.is_object() ? number("group_rank") : std::nullopt;
        const auto world = message.is_object() ? number("world_size") : std::nullopt;
        const auto group_world = message.is_object() ? number("group_world_size") : std::nullopt;
        const auto interval = message.is_object() ? number("heartbeat_interval_ms") : std::nullopt;
        if (!rank || !world || !group_world || !interval || *interval <= 0) {
          job_error(job, "an assignment without its numbers: " + agent.assignment);
          agent.assignment.clear();
          continue;
        }
        ++assigned;
        last = std::max(last.value_or(agent.assigned_at), agent.assigned_at);
        agent.heartbeat_interval = std::chrono::milliseconds(*interval);
        interval_ms = std::max(interval_ms, *interval);
        const auto n = static_cast<int64_t>(size);
        if (*rank < 0 || *rank >= n || ranked[*rank] || *world != n || *group_world != n)
          ranks_exact = false;
        else
          ranked[*rank] = true;
        agent.assignment.clear();  // Its numbers are kept; the bytes are not needed again.
      }
      const bool in_time = waiting == 0;
      json judged{
          {"job", job.id},
          {"agents", size},
          {"seconds",
           in_time && last ? json(std::chrono::duration<double>(*last - start_).count()) : json()},
          {"assigned", assigned},
          {"ok", in_time && assigned == size && ranks_exact && job.errors == 0},
          {"errors", job.errors},
          {"waiting", waiting},
          {"first_error", job.first_error ? json(*job.first_error) : json()},
          {"heartbeat_interval_ms", assigned ? json(interval_ms) : json()}};
      answer["jobs"].push_back(std::move(judged));
    }
    return answer;
  }

  // ------------------------------------------------------------------ idle

  void idle(double seconds, Report report) {
    std::vector<Agent*> assigned;
    for (auto& agent : agents_)
      if (agent->heartbeat_interval.count() > 0) assigned.push_back(agent.get());
    if (assigned.empty()) return report({{"error", "idle: no agent holds an assignment"}});
    idle_agents_ = std::move(assigned);
    heartbeats_sent_ = 0;
    begin("idle", std::move(report), 0,
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
    due_ = {};
    const size_t count = idle_agents_.size();
    for (size_t k = 0; k < count; ++k)
      due_.push({start_ + std::chrono::duration_cast<Clock::duration>(
                              idle_agents_[k]->heartbeat_interval) *
                              static_cast<int64_t>(k) / static_cast<int64_t>(count),
                 k});
    heartbeat();
  }

  /// Sends every heartbeat that has come due, then waits for the next one: each at its own
  /// time, as agents on separate hosts send them.
  void heartbeat() {
    const Clock::time_point now = Clock::now();
    while (!due_.empty() && due_.top().first <= now) {
      auto [at, k] = due_.top();
      due_.pop();
      Agent& agent = *idle_agents_[k];
      if (agent.closed) continue;
      send(agent, kHeartbeat);
      ++heartbeats_sent_;
      due_.push({at + agent.heartbeat_interval, k});
    }
    if (due_.empty()) return;
    heartbeat_timer_.expires_at(due_.top().first);
    heartbeat_timer_.async_wait([this](boost::system::error_code ec) {
      if (!ec) heartbeat();
    });
  }

  json idle_answer(Clock::time_point ended) {
    size_t lost = 0;
    std::optional<std::string> first_lost;
    for (Agent* agent : idle_agents_) {
      if (!agent->closed) continue;
      ++lost;
      if (!first_lost) first_lost = agent->closed_because;
    }
    return {{"phase", "idle"},
            {"seconds", std::chrono::duration<double>(ended - start_).count()},
            {"agents", idle_agents_.size()},
            {"heartbeats", heartbeats_sent_},
            {"lost", lost},
            {"first_lost", first_lost ? json(*first_lost) : json()}};
  }

  asio::io_context& io_;
  tcp::endpoint server_;
  size_t sources_;  ///< Loopback source addresses the agents connect from (127.0.0.1 up).
  std::chrono::milliseconds timeout_;
  asio::steady_timer deadline_, heartbeat_timer_;
  std::vector<std::unique_ptr<Agent>> agents_;  // unique_ptr: handlers hold references to them.

  std::string phase_;
  Report report_;
  size_t outstanding_ = 0;
  Clock::time_point start_;

  size_t connect_from_ = 0, connect_errors_ = 0;
  std::optional<std::string> connect_first_error_;

  std::vector<Job> jobs_;
  size_t join_commands_ = 0;  ///< Makes each join command's job ids new.

  std::vector<Agent*> idle_agents_;
  using Due = std::pair<Clock::time_point, size_t>;  ///< When, and which of idle_agents_.
  std::priority_queue<Due, std::vector<Due>, std::greater<>> due_;
  size_t heartbeats_sent_ = 0;
};

}  // namespace
}  // namespace rendezvous_load

int main(int argc, char** argv) {
  return load_generator::main<rendezvous_load::LoadGenerator>(argc, argv, "rendezvous_load");
}
