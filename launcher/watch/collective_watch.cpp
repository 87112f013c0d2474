#include "launcher/watch/collective_watch.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "common/logging.hpp"
#include "common/topology.hpp"

namespace mcprun {
namespace {

using Clock = CollectiveWatch::Clock;

/// Whether two ranks' pending entries are the same call: by sequence number where the Flight
/// Recorder gave one, else (torch 1.x's stacks) by operation.
bool same_call(const PendingCollective& a, const PendingCollective& b) {
  if (a.group != b.group || a.op != b.op || a.in_backward != b.in_backward) return false;
  return a.seq < 0 || b.seq < 0 || a.seq == b.seq;
}

/// "train.py:12 in step < train.py:40 in main": the innermost frames first.
std::string innermost_frames(const std::vector<std::string>& frames, size_t count = 3) {
  std::string text;
  for (size_t i = 0; i < std::min(count, frames.size()); ++i)
    text += (i ? " < " : "") + frames[frames.size() - 1 - i];
  return text.empty() ? "(no Python frames)" : text;
}

/// torch 1.x: a rank in backward() outside any collective its stack shows is, under DDP, most
/// likely in the gradient all-reduce the reducer issues from C++.
bool in_unseen_backward(const ProgressRecord& record) {
  if (record.source != "stack" || !record.pending.empty()) return false;
  // backward() and, on torch 2.x falling back to stacks, the engine call beneath it.
  const size_t innermost = std::min<size_t>(record.frames.size(), 3);
  return std::any_of(
      record.frames.end() - innermost, record.frames.end(), [](const std::string& frame) {
        return frame.ends_with(" in backward") || frame.ends_with(" in _engine_run_backward");
      });
}

}  // namespace

Expected<ProgressRecord> parse_progress_record(std::string_view text) {
  try {
    const auto json = nlohmann::json::parse(text);
    ProgressRecord record;
    record.rank = json.at("rank").get<int>();
    record.pid = json.at("pid").get<int>();
    record.number = json.at("n").get<int64_t>();
    record.source = json.at("source").get<std::string>();
    record.completed = json.at("completed").get<int64_t>();
    record.cpu_s = json.at("cpu_s").get<double>();
    for (const auto& entry : json.at("pending")) {
      PendingCollective pending;
      pending.group = entry.at("group").get<std::string>();
      pending.group_ranks = entry.value("group_ranks", std::vector<int>{});
      pending.op = entry.at("op").get<std::string>();
      pending.seq = entry.value("seq", int64_t{-1});
      pending.backend = entry.value("backend", std::string());
      pending.pending_s = entry.value("pending_s", 0.0);
      pending.in_backward = entry.value("in_backward", false);
      record.pending.push_back(std::move(pending));
    }
    record.frames = json.value("frames", std::vector<std::string>{});
    record.exiting = json.value("exiting", false);
    record.host = json.value("host", std::string());
    record.local_rank = json.value("local_rank", -1);
    record.run_delay_s = json.value("run_delay_s", 0.0);
    record.loader_s = json.value("loader_s", -1.0);
    if (auto quota = json.find("cpu_quota"); quota != json.end()) {
      record.cpu_quota_cores = quota->at(0).get<double>();
      record.cpu_periods = quota->at(1).get<int64_t>();
      record.cpu_throttled_periods = quota->at(2).get<int64_t>();
    }
    record.sent_ns = json.value("sent_ns", int64_t{0});
    if (auto arrivals = json.find("arrivals"); arrivals != json.end()) {
      const int64_t t0_ns = arrivals->at("t0_ns").get<int64_t>();
      for (const auto& [group, entry] : arrivals->at("groups").items()) {
        GroupArrivals& parsed = record.arrivals[group];
        parsed.group_ranks = entry.value("ranks", std::vector<int>{});
        parsed.step_s = entry.value("step_us", 0.0) / 1e6;
        parsed.period = std::clamp(entry.value("period", 0), 0, 1024);
        const auto ops = entry.value("ops", std::vector<std::string>{});
        for (const auto& arrival : entry.at("c")) {
          GroupArrivals::Arrival& parsed_arrival = parsed.arrivals.emplace_back();
          parsed_arrival.seq = arrival.at(0).get<int64_t>();
          parsed_arrival.created_ns = t0_ns + arrival.at(1).get<int64_t>() * 1000;
          parsed_arrival.elements = arrival.at(2).get<int64_t>();
          if (arrival.size() < 7) continue;  // An older reporter's: no completion.
          if (const auto done_us = arrival.at(3).get<int64_t>(); done_us >= 0)
            parsed_arrival.done_ns = t0_ns + done_us * 1000;
          parsed_arrival.bytes = std::max<int64_t>(arrival.at(4).get<int64_t>(), 0);
          if (const auto op = arrival.at(5).get<size_t>(); op < ops.size())
            parsed_arrival.op = ops[op];
          if (const auto gpu_us = arrival.at(6).get<int64_t>(); gpu_us >= 0)
            parsed_arrival.gpu_s = static_cast<double>(gpu_us) / 1e6;
        }
      }
    }
    if (record.rank < 0) return Error{fmt::format("rank {} is negative", record.rank)};
    return record;
  } catch (const std::exception& error) {
    return Error{std::string("not a progress record: ") + error.what()};
  }
}

std::string describe(const PendingCollective& collective) {
  std::string text = collective.in_backward ? "DDP's gradient " + collective.op : collective.op;
  if (collective.seq >= 0) text += fmt::format(" #{}", collective.seq);
  text += " on group " + collective.group;
  if (!collective.backend.empty()) text += " (" + collective.backend + ")";
  if (collective.in_backward) text += " in backward()";
  return text;
}

/// The call a rank's last record caught, or its frames outside one.
std::string last_call(const ProgressRecord& last) {
  return "last in " + (last.pending.empty() ? "user code: " + innermost_frames(last.frames)
                                            : describe(last.pending.front()));
}

namespace {

/// A state's text in the compact form at most: a few innermost frames fit.
constexpr size_t kMaxStateBytes = 512;

/// "0-3,5" in `max_bytes` at most: a longer list ends at a whole range, and the ranks it left
/// out are counted.
std::pair<std::string, size_t> bounded_rank_list(std::vector<int> ranks, size_t max_bytes) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string text;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    std::string range = std::to_string(ranks[i]);
    if (j > i) range += '-' + std::to_string(ranks[j]);
    if (text.size() + range.size() + 1 > max_bytes) return {text, ranks.size() - i};
    if (!text.empty()) text += ',';
    text += range;
    i = j + 1;
  }
  return {text, 0};
}

/// A rank list in either form: an array of numbers, or ranges in one string.
std::vector<int> rank_list_from_json(const nlohmann::json& json) {
  if (!json.is_string()) return json.get<std::vector<int>>();
  auto ranks = parse_cpulist(json.get<std::string>());
  if (!ranks) throw std::invalid_argument("a malformed rank list: " + json.get<std::string>());
  return *ranks;
}

}  // namespace

nlohmann::json to_json(const CollectiveStall& stall) {
  const PendingCollective& c = stall.collective;
  nlohmann::json states = nlohmann::json::object();
  for (const auto& [rank, state] : stall.states) states[std::to_string(rank)] = state;
  return {{"group", c.group},
          {"group_ranks", c.group_ranks},
          {"op", c.op},
          {"seq", c.seq},
          {"backend", c.backend},
          {"pending_s", c.pending_s},
          {"in", stall.in},
          {"missing", stall.missing},
          {"states", states},
          {"mismatch", stall.mismatch},
          {"source", stall.source},
          {"in_backward", c.in_backward}};
}

nlohmann::json to_compact_json(const CollectiveStall& stall, size_t max_bytes) {
  const PendingCollective& c = stall.collective;
  nlohmann::json json{{"group", c.group},
                      {"op", c.op},
                      {"seq", c.seq},
                      {"backend", c.backend},
                      {"pending_s", c.pending_s},
                      {"mismatch", stall.mismatch},
                      {"source", stall.source},
                      {"in_backward", c.in_backward}};
  // A quarter of the frame for each list at most: only a pathological pattern (every other
  // rank) comes near it; the states take what is left.
  const size_t list_bytes = max_bytes / 4;
  for (auto [name, ranks] : {std::pair{"group_ranks", &c.group_ranks}, std::pair{"in", &stall.in},
                             std::pair{"missing", &stall.missing}}) {
    auto [text, left_out] = bounded_rank_list(*ranks, list_bytes);
    json[name] = std::move(text);
    if (left_out) json[std::string(name) + "_left_out"] = left_out;
  }
  std::map<std::string_view, std::vector<int>> by_state;
  for (const auto& [rank, state] : stall.states) by_state[state].push_back(rank);
  std::vector<std::pair<std::string_view, std::vector<int>>> groups(by_state.begin(),
                                                                    by_state.end());
  std::stable_sort(groups.begin(), groups.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  // Room kept for the "states" key and its "states_left_out" count, added below.
  size_t used = json.dump().size() + 64;
  size_t left_out = 0;
  nlohmann::json states = nlohmann::json::array();
  for (const auto& [state, ranks] : groups) {
    const size_t room = max_bytes > used ? max_bytes - used : 0;
    auto [text, cut] = bounded_rank_list(ranks, room);
    nlohmann::json group{{"ranks", std::move(text)},
                         {"state", std::string(state.substr(0, kMaxStateBytes))}};
    const size_t size = group.dump().size() + 1;
    if (cut == ranks.size() || size > room) {
      left_out += ranks.size();
      continue;
    }
    left_out += cut;
    used += size;
    states.push_back(std::move(group));
  }
  json["states"] = std::move(states);
  if (left_out) json["states_left_out"] = left_out;
  return json;
}

CollectiveStall collective_stall_from_json(const nlohmann::json& json) {
  CollectiveStall stall;
  PendingCollective& c = stall.collective;
  c.group = json.at("group");
  c.group_ranks = rank_list_from_json(json.at("group_ranks"));
  c.op = json.at("op");
  c.seq = json.at("seq");
  c.backend = json.at("backend");
  c.pending_s = json.at("pending_s");
  c.in_backward = json.value("in_backward", false);
  stall.in = rank_list_from_json(json.at("in"));
  stall.missing = rank_list_from_json(json.at("missing"));
  const nlohmann::json& states = json.at("states");
  if (states.is_array()) {  // The compact form: [{"ranks": "0-3,7", "state": "..."}].
    for (const nlohmann::json& group : states) {
      const std::string state = group.at("state").get<std::string>();
      for (int rank : rank_list_from_json(group.at("ranks"))) stall.states[rank] = state;
    }
  } else {
    for (const auto& [rank, state] : states.items())
      stall.states[std::stoi(rank)] = state.get<std::string>();
  }
  stall.mismatch = json.at("mismatch");
  stall.source = json.at("source");
  return stall;
}

namespace {

/// Whether a rank's CPU counts as progress: a rank waiting in a collective may spin (NCCL), so
/// only ranks outside one count, and those in backward(), whose CPU computes gradients.
bool computing(const ProgressRecord& record) {
  return std::all_of(record.pending.begin(), record.pending.end(),
                     [](const PendingCollective& pending) { return pending.in_backward; });
}

/// Whether a process computed between two looks `wall` seconds apart: its CPU, its main thread
/// running or waiting to run (a loaded box gives a computing rank little CPU, but then it waits
/// for it), or its main thread's reads and writes (printing, loading a file). A rank blocked on
/// a lock, a pipe or a peer does none of these; its reporter's own CPU is far below the share.
bool kernel_busy(const ProcessActivity& before, const ProcessActivity& after, double wall) {
  const double busy_s = kBusyCpuShare * wall;
  if (after.cpu_s - before.cpu_s >= busy_s) return true;
  if (before.main_run_s >= 0 && after.main_run_s >= 0 &&
      (after.main_run_s - before.main_run_s) + (after.main_run_delay_s - before.main_run_delay_s) >=
          busy_s)
    return true;
  return before.main_io_bytes >= 0 && after.main_io_bytes > before.main_io_bytes;
}

}  // namespace

CollectiveWatch::CollectiveWatch(double timeout_s, double interval_s, Clock::time_point now)
    : timeout_s_(timeout_s), interval_s_(interval_s), last_progress_(now) {}

void CollectiveWatch::observe(ProgressRecord record, Clock::time_point now) {
  if (record.exiting) exiting_at_.try_emplace(record.rank, std::chrono::system_clock::now());
  auto it = ranks_.find(record.rank);
  if (it == ranks_.end() || it->second.last.pid != record.pid) {
    last_progress_ = now;  // A rank that joins (or a new process) is progress.
    ranks_[record.rank] = {std::move(record), now};
    return;
  }
  RankView& view = it->second;
  if (record.number <= view.last.number) return;  // Late or replayed: nothing new.
  const double wall = seconds_between(view.received, now);
  const bool completed_more = record.completed > view.last.completed;
  // Its CPU, or its main thread's wait for a CPU that a loaded box did not give it.
  const double busy_s =
      (record.cpu_s - view.last.cpu_s) + (record.run_delay_s - view.last.run_delay_s);
  const bool busy = computing(record) && wall > 0 && busy_s >= kBusyCpuShare * wall;
  if (completed_more || busy) last_progress_ = now;
  view.last = std::move(record);
  view.received = now;
}

void CollectiveWatch::observe_kernel(int rank, pid_t pid, const ProcessActivity& activity,
                                     Clock::time_point now) {
  KernelSample& sample = kernel_[rank];
  const double wall = seconds_between(sample.at, now);
  if (sample.pid == pid && wall > 0) {
    auto view = ranks_.find(rank);
    // Its reporter sends a first record only once the process group exists, and none while a
    // call holds the GIL: until then, only the kernel knows whether the rank computes.
    const bool may_compute =
        view == ranks_.end() || view->second.last.pid != pid || computing(view->second.last);
    if (may_compute && kernel_busy(sample.activity, activity, wall)) {
      // Said only where the records are silent: the case this evidence exists for.
      const bool silent =
          view == ranks_.end() || seconds_between(view->second.received, now) > 2 * interval_s_;
      if (silent)
        spdlog::debug(
            "collective watch: rank {} (pid {}), no recent record, is busy by its kernel "
            "counts: CPU {:.2f} s, main thread on a CPU {:.2f} s and waiting for one "
            "{:.2f} s, in {:.2f} s",
            rank, pid, activity.cpu_s - sample.activity.cpu_s,
            activity.main_run_s - sample.activity.main_run_s,
            activity.main_run_delay_s - sample.activity.main_run_delay_s, wall);
      last_progress_ = now;
    }
  }
  sample = {pid, activity, now};
}

void CollectiveWatch::rank_ended(int rank, std::string how) { ended_[rank] = std::move(how); }

bool CollectiveWatch::gone(int rank) const {
  if (ended_.contains(rank)) return true;
  auto it = ranks_.find(rank);
  return it != ranks_.end() && it->second.last.exiting;
}

std::optional<CollectiveStall> CollectiveWatch::check(Clock::time_point now) const {
  if (seconds_between(last_progress_, now) < timeout_s_) return std::nullopt;
  // The pending entries of ranks still running, each distinct call once with how many there
  // are: comparing every rank's entries with every other's takes seconds at 16,384 ranks.
  std::map<std::tuple<std::string_view, std::string_view, int64_t>,
           std::pair<const PendingCollective*, size_t>>
      calls;
  for (const auto& [rank, view] : ranks_) {
    if (gone(rank)) continue;
    for (const PendingCollective& pending : view.last.pending) {
      auto& call = calls[{pending.group, pending.op, pending.seq}];
      if (!call.first) call.first = &pending;
      ++call.second;
    }
  }
  // The collective: the call the most ranks wait in, the longest pending among equals.
  const PendingCollective* chosen = nullptr;
  size_t chosen_count = 0;
  double chosen_age = -1;
  for (const auto& [rank, view] : ranks_) {
    if (gone(rank)) continue;
    for (const PendingCollective& pending : view.last.pending) {
      size_t count = 0;
      for (const auto& [key, call] : calls)
        if (same_call(pending, *call.first)) count += call.second;
      const double age = pending.pending_s + seconds_between(view.received, now);
      if (std::tie(count, age) > std::tie(chosen_count, chosen_age)) {
        chosen = &pending;
        chosen_count = count;
        chosen_age = age;
      }
    }
  }
  if (!chosen) return std::nullopt;  // Everyone is outside collectives: idle, not stuck.
  // Pending for the whole timeout too: ranks that idled (a data loader's sleep) and then wait
  // for a peer still idling have waited only since they arrived.
  if (chosen_age < timeout_s_) return std::nullopt;

  CollectiveStall stall;
  stall.collective = *chosen;
  stall.collective.pending_s = chosen_age;
  std::set<int> members(chosen->group_ranks.begin(), chosen->group_ranks.end());
  if (members.empty())
    for (const auto& [rank, view] : ranks_) members.insert(rank);
  std::set<int> known(members);
  for (const auto& [rank, view] : ranks_) {
    known.insert(rank);
    if (stall.source.empty() || stall.source == view.last.source)
      stall.source = view.last.source;
    else
      stall.source = "mixed";
  }
  for (const auto& [rank, how] : ended_) known.insert(rank);
  for (int member : members) {
    auto it = ranks_.find(member);
    bool in = false;
    if (it != ranks_.end() && !gone(member))
      for (const PendingCollective& pending : it->second.last.pending)
        in |= same_call(*chosen, pending);
    (in ? stall.in : stall.missing).push_back(member);
    if (!in && it != ranks_.end() && !gone(member) &&
        (!it->second.last.pending.empty() || in_unseen_backward(it->second.last)))
      stall.mismatch = true;
  }
  for (int rank : known) stall.states[rank] = state_of(rank, &stall.collective, now);
  return stall;
}

std::map<int, std::string> CollectiveWatch::ranks_in_collectives(Clock::time_point now) const {
  std::map<int, std::string> states;
  bool any_pending = false;
  for (const auto& [rank, view] : ranks_) {
    any_pending |= !view.last.pending.empty();
    states[rank] = state_of(rank, nullptr, now);
  }
  if (!any_pending) states.clear();
  return states;
}

std::string CollectiveWatch::state_of(int rank, const PendingCollective* stalled,
                                      Clock::time_point now) const {
  auto it = ranks_.find(rank);
  if (auto ended = ended_.find(rank); ended != ended_.end())
    // Which rank exits first after a timeout is a race: the call it was in says more.
    return "exited: " + ended->second +
           (it == ranks_.end() ? "" : "; " + last_call(it->second.last));
  if (it == ranks_.end()) return "sent no progress record: no process group seen";
  const RankView& view = it->second;
  const double age = seconds_between(view.received, now);
  // A stall report counts an exiting rank out; a failure report shows the call it left.
  if (view.last.exiting && stalled)
    return "exiting (its interpreter is shutting down); " + last_call(view.last);
  for (const PendingCollective& pending : view.last.pending) {
    const double pending_for = pending.pending_s + age;
    if (!stalled || same_call(*stalled, pending))
      return fmt::format("in {} for {:.0f} s", describe(pending), pending_for);
    return fmt::format("in {} for {:.0f} s: a mismatch", describe(pending), pending_for);
  }
  if (in_unseen_backward(view.last))
    return "in backward(), where DDP's gradient all-reduce runs (torch 1.x cannot name it): "
           "likely a mismatch; " +
           innermost_frames(view.last.frames);
  if (age > kStaleIntervals * interval_s_)
    return fmt::format("no record for {:.0f} s{}; last in user code: {}", age, kSilentReporterGuess,
                       innermost_frames(view.last.frames));
  return "in user code: " + innermost_frames(view.last.frames);
}

}  // namespace mcprun
