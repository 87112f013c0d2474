#include "launcher/watch/straggler_watch.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <tuple>

#include "common/sys.hpp"

namespace mcprun {
namespace {

using Clock = StragglerWatch::Clock;

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle),
                   values.end());
  return values[middle];
}

/// The main thread is in torch's DataLoader (the loader itself, or the dataset it fetches from).
bool in_data_loader(const std::vector<std::string>& frames) {
  return std::any_of(frames.begin(), frames.end(), [](const std::string& frame) {
    return frame.starts_with("dataloader.py:") || frame.starts_with("fetch.py:");
  });
}

std::string percent(double share) { return fmt::format("{:.0f}%", 100 * share); }

// A run-queue wait of kStarvedRunDelayShare, and this many times the others', is starvation.
constexpr double kStarvedOverOthers = 2;
// "Most of the others' waits": two thirds, so that two ranks that take turns (half each) are no
// straggler, while one that is late at nearly every step (nine tenths and more) is.
constexpr double kMostOfTheWaits = 2.0 / 3.0;
// Fewer late steps in a window are events, not a pattern: two evaluations in a short window
// are 5 % of its sampled steps, by chance, and no straggler.
constexpr size_t kMinLateSteps = 5;
// A completion this much later than the others' is no artefact of the reporters' 20 ms polls.
constexpr double kCompletionSkewFloor = 0.05;
// A straggler "in its own compute" uses this many times the others' CPU at least: one that uses
// no more than they do spends its lateness waiting on something, not computing.
constexpr double kComputeOverOthers = 1.25;
// ...and its CPU beyond theirs, a step, stretched by its waits for a CPU while it ran, covers this
// much of its lateness a step at least: 13 % of a CPU against the others' 11 % is 10 ms more a
// 480 ms step, which explains no 25 ms of lateness (a rank behind a slow link, whose waits are the
// link's); beside a CPU hog, 11 ms more CPU took 16 ms of wall clock.
constexpr double kComputeCoversLateness = 2.0 / 3.0;
// Throttled in most of its cgroup's periods: the quota, not the box, is what it runs short of.
constexpr double kThrottledShare = 0.5;
// A quarter of its wall clock in the data loader, and twice the others': the loader is where its
// time goes. (Where only sampled stacks tell, a quarter of its samples: one a second, coarse.)
constexpr double kDataLoaderShare = 0.25;
constexpr double kDataLoaderOverOthers = 2;

}  // namespace

void StragglerWatch::observe(const ProgressRecord& record, int64_t received_ns,
                             Clock::time_point now) {
  ranks_[record.rank] = {record.host, record.local_rank, record.pid};
  if (record.sent_ns > 0) {
    // The smallest (received - sent) is the rank's clock offset plus the shortest one-way delay.
    const int64_t offset = received_ns - record.sent_ns;
    auto [it, added] = offset_ns_.emplace(record.rank, offset);
    if (!added) it->second = std::min(it->second, offset);
  }
  auto& history = history_[record.rank];
  history.push_back({now, record.cpu_s, record.run_delay_s, in_data_loader(record.frames),
                     record.loader_s, record.cpu_quota_cores, record.cpu_periods,
                     record.cpu_throttled_periods});
  while (!history.empty() && seconds_between(history.front().received, now) > settings_.window_s)
    history.pop_front();

  for (const auto& [group, arrivals] : record.arrivals) {
    if (arrivals.step_s > 0) steps_[group][record.rank] = arrivals.step_s;
    if (arrivals.period > 0) periods_[group][record.rank] = arrivals.period;
    auto& reporting = reporting_[group];
    if (std::find(reporting.begin(), reporting.end(), record.rank) == reporting.end())
      reporting.push_back(record.rank);
    auto& open = open_[group];
    for (const GroupArrivals::Arrival& arrival : arrivals.arrivals) {
      auto [it, added] = open.try_emplace(arrival.seq);
      Collective& collective = it->second;
      if (added) collective.first_seen = now;
      if (!arrivals.group_ranks.empty()) collective.members = arrivals.group_ranks;
      collective.created_ns[record.rank] = arrival.created_ns;
      if (arrival.done_ns >= arrival.created_ns) collective.done_ns[record.rank] = arrival.done_ns;
      if (arrival.gpu_s >= 0 && (collective.gpu_s < 0 || arrival.gpu_s < collective.gpu_s))
        collective.gpu_s = arrival.gpu_s;
      collective.bytes = std::max(collective.bytes, arrival.bytes);
      if (!arrival.op.empty()) collective.op = arrival.op.substr(0, 80);
      // A group of more than 64 ranks is sent without its members: every rank reporting it.
      const size_t expected =
          collective.members.empty() ? reporting.size() : collective.members.size();
      if (collective.created_ns.size() >= expected && expected > 1) {
        complete(group, arrival.seq, collective);
        open.erase(it);
      }
    }
    // One that never completes (a rank's arrivals were not read in time) ages out.
    std::erase_if(open, [&](const auto& entry) {
      return seconds_between(entry.second.first_seen, now) > settings_.window_s;
    });
  }
}

int64_t StragglerWatch::on_this_clock(int rank, int64_t rank_ns) const {
  auto offset = offset_ns_.find(rank);
  return rank_ns + (offset == offset_ns_.end() ? 0 : offset->second);
}

void StragglerWatch::time(const std::string& group, int64_t seq, const Collective& collective,
                          int64_t last_arrival_ns) {
  std::optional<int64_t> done;  // The first member to see it done: the others' polls were late.
  for (const auto& [rank, done_ns] : collective.done_ns) {
    const int64_t here = on_this_clock(rank, done_ns);
    if (!done || here < *done) done = here;
  }
  if (!done) return;
  auto& [last_seq, last_done] = last_done_[group];
  // A group runs its collectives in order: one queued behind the previous starts when it ends.
  const int64_t start =
      seq == last_seq + 1 ? std::max(last_arrival_ns, last_done) : last_arrival_ns;
  if (seq > last_seq) std::tie(last_seq, last_done) = std::tie(seq, *done);
  CollectiveTiming timing;
  timing.group = group;
  timing.op = collective.op;
  timing.bytes = collective.bytes;
  for (const auto& [rank, created] : collective.created_ns) timing.ranks.push_back(rank);
  // On the GPU the last to arrive waits least: its kernel's time is the transfer's.
  timing.seconds =
      collective.gpu_s >= 0 ? collective.gpu_s : static_cast<double>(*done - start) / 1e9;
  timing.done_ns = *done;
  bandwidth_.add(timing);
}

void StragglerWatch::complete(const std::string& group, int64_t seq, const Collective& collective) {
  std::vector<std::pair<int64_t, int>> arrivals;  // On this host's clock.
  for (const auto& [rank, created] : collective.created_ns)
    arrivals.emplace_back(on_this_clock(rank, created), rank);
  const auto last = std::max_element(arrivals.begin(), arrivals.end());
  time(group, seq, collective, last->first);
  std::vector<double> others;
  for (auto it = arrivals.begin(); it != arrivals.end(); ++it)
    if (it != last) others.push_back(static_cast<double>(it->first));
  Sample sample;
  sample.seq = seq;
  sample.last_created_ns = last->first;
  sample.last_rank = last->second;
  sample.lag_s = (static_cast<double>(last->first) - median(others)) / 1e9;
  for (double other : others)
    sample.others_wait_s += (static_cast<double>(last->first) - other) / 1e9;
  if (!others.empty()) sample.others_wait_s /= static_cast<double>(others.size());
  // How much later than the others it saw the previous collective complete: a last arrival
  // that much behind was late before its own work began (a slow link on its ring). Completions
  // are polled every 20 ms, so a skew counts from kCompletionSkewFloor, and as half the lag.
  auto& [previous_seq, previous] = previous_done_[group];
  if (previous_seq == seq - 1 && previous.contains(sample.last_rank)) {
    std::vector<double> others_done;
    for (const auto& [created, rank] : arrivals)
      if (rank != sample.last_rank && previous.contains(rank))
        others_done.push_back(static_cast<double>(previous.at(rank)));
    if (!others_done.empty()) {
      const double skew_s =
          (static_cast<double>(previous.at(sample.last_rank)) - median(others_done)) / 1e9;
      sample.late_from_previous = skew_s >= std::max(kCompletionSkewFloor, sample.lag_s / 2);
    }
  }
  previous_seq = seq;
  previous.clear();
  for (const auto& [rank, done_ns] : collective.done_ns)
    previous[rank] = on_this_clock(rank, done_ns);
  samples_[group].push_back(sample);
  for (const auto& [created, rank] : arrivals) {
    RankArrivals& counts = arrivals_[rank];
    if (auto info = ranks_.find(rank); info != ranks_.end())
      std::tie(counts.host, counts.local_rank) =
          std::tie(info->second.host, info->second.local_rank);
    ++counts.collectives;
    counts.waited_s += static_cast<double>(last->first - created) / 1e9;
  }
  RankArrivals& last_counts = arrivals_[sample.last_rank];
  ++last_counts.arrived_last;
  last_counts.lag_s = sample.lag_s;
  recent_.push_back({group, seq, {}});
  for (const auto& [created, rank] : arrivals)
    if (static_cast<size_t>(rank) < kMaxPictureRows || rank == sample.last_rank)
      recent_.back().arrivals.emplace_back(rank, created);
  if (recent_.size() > kRecentCollectives) recent_.pop_front();
}

RankActivity StragglerWatch::activity(int rank) const {
  RankActivity activity;
  auto it = history_.find(rank);
  if (it == history_.end() || it->second.size() < 2) return activity;
  const auto& history = it->second;
  const double wall = seconds_between(history.front().received, history.back().received);
  if (wall > 0) {
    activity.cpu_share = (history.back().cpu_s - history.front().cpu_s) / wall;
    activity.run_delay_share = (history.back().run_delay_s - history.front().run_delay_s) / wall;
  }
  // Periods since the first record under the quota it has now: a rank moved into a cgroup
  // while it runs has counts from there on.
  const RankRecord& latest = history.back();
  activity.cpu_quota_cores = latest.cpu_quota_cores;
  const auto since = std::find_if(history.begin(), history.end(), [&](const RankRecord& record) {
    return record.cpu_quota_cores == latest.cpu_quota_cores &&
           record.cpu_periods <= latest.cpu_periods;
  });
  if (latest.cpu_quota_cores > 0 && latest.cpu_periods > since->cpu_periods)
    activity.throttled_share =
        static_cast<double>(latest.cpu_throttled_periods - since->cpu_throttled_periods) /
        static_cast<double>(latest.cpu_periods - since->cpu_periods);
  // The loader's own clock where the reporter keeps one (from its first record that has it).
  const auto timed = std::find_if(history.begin(), history.end(),
                                  [](const RankRecord& record) { return record.loader_s >= 0; });
  const double timed_wall =
      timed == history.end() ? 0 : seconds_between(timed->received, latest.received);
  if (latest.loader_s >= 0 && timed_wall > 0) {
    activity.data_loader_share = std::max(0.0, latest.loader_s - timed->loader_s) / timed_wall;
    return activity;
  }
  const auto loading = std::count_if(history.begin(), history.end(), [](const RankRecord& record) {
    return record.in_data_loader;
  });
  activity.data_loader_share = static_cast<double>(loading) / static_cast<double>(history.size());
  return activity;
}

double StragglerWatch::cpu_wait_share(const std::vector<int>& ranks) const {
  std::vector<double> shares;
  for (int rank : ranks) shares.push_back(activity(rank).run_delay_share);
  return shares.empty() ? 0 : median(std::move(shares));
}

StragglerWatch::Cause StragglerWatch::cause_of(const StragglerEpisode& episode) const {
  const int rank = episode.rank;
  const RankActivity own = activity(rank);
  std::vector<double> cpu, run_delay, data_loader;
  for (const auto& [other, history] : history_) {
    if (other == rank) continue;
    const RankActivity theirs = activity(other);
    cpu.push_back(theirs.cpu_share);
    run_delay.push_back(theirs.run_delay_share);
    data_loader.push_back(theirs.data_loader_share);
  }
  if (own.cpu_quota_cores > 0 && own.throttled_share >= kThrottledShare)
    return {fmt::format("throttled by its cgroup's CPU quota ({}): throttled in {} of its periods",
                        own.cpu_quota_cores < 1 ? percent(own.cpu_quota_cores) + " of a core"
                                                : fmt::format("{:g} cores", own.cpu_quota_cores),
                        percent(own.throttled_share)),
            true};
  const double others_delay = median(run_delay);
  if (own.run_delay_share >= kStarvedRunDelayShare &&
      own.run_delay_share >= kStarvedOverOthers * others_delay)
    return {fmt::format("starved of CPU: it waited for a CPU {} of the time, the others {}",
                        percent(own.run_delay_share), percent(others_delay)),
            true};
  if (own.data_loader_share >= kDataLoaderShare &&
      own.data_loader_share >= kDataLoaderOverOthers * median(data_loader))
    return {fmt::format("in its data loader: {} of its time was in torch's DataLoader, the "
                        "others' {}",
                        percent(own.data_loader_share), percent(median(data_loader))),
            true};
  const double others_cpu = median(cpu);
  const double extra_cpu_s = (own.cpu_share - others_cpu) * episode.step_s;
  const double stretch = own.cpu_share > 0 ? 1 + own.run_delay_share / own.cpu_share : 1;
  const double lateness_s = episode.share * episode.median_lag_s;
  const bool covers =
      episode.step_s <= 0 || extra_cpu_s * stretch >= kComputeCoversLateness * lateness_s;
  if (own.cpu_share >= kComputeOverOthers * others_cpu && own.cpu_share > 0 && covers)
    return {fmt::format("in its own compute: it used {} of a CPU, the others {}",
                        percent(own.cpu_share), percent(others_cpu)),
            true};
  // More CPU than theirs, but too little to be where its lateness goes: said with the figures.
  const std::string beyond =
      extra_cpu_s > 0 && episode.step_s > 0
          ? fmt::format(", {} more a step against {} of lateness a step",
                        human_duration(extra_cpu_s), human_duration(lateness_s))
          : "";
  return {fmt::format("not in CPU work of its own (it used {} of a CPU, the others {}{}): a wait "
                      "between its collectives (I/O, a lock, a sleep, its GPU)",
                      percent(own.cpu_share), percent(others_cpu), beyond),
          false};
}

std::optional<StragglerEpisode> StragglerWatch::judge(int64_t wall_ns) const {
  // The group with the most collectives in the window: the default group under DDP.
  const std::deque<Sample>* samples = nullptr;
  const std::string* group = nullptr;
  for (const auto& [name, its] : samples_)
    if (!samples || its.size() > samples->size()) {
      samples = &its;
      group = &name;
    }
  if (!samples || samples->size() < static_cast<size_t>(kMinStragglerCollectives))
    return std::nullopt;
  // Half a window at least: the first steps (warm-up, first buckets) are no pattern.
  if (static_cast<double>(wall_ns - samples->front().last_created_ns) / 1e9 <
      settings_.window_s / 2)
    return std::nullopt;

  // The window's step: its collectives' pace, by sequence number (thinned arrivals leave gaps),
  // over the period the reporters found; their own step figure may predate a slowdown.
  int period = 0;
  if (auto periods = periods_.find(*group); periods != periods_.end()) {
    std::vector<double> each;
    for (const auto& [rank, its] : periods->second) each.push_back(its);
    period = static_cast<int>(median(std::move(each)));
  }
  auto [first_seq, last_seq] =
      std::minmax_element(samples->begin(), samples->end(),
                          [](const Sample& a, const Sample& b) { return a.seq < b.seq; });
  const double span_s =
      static_cast<double>(samples->back().last_created_ns - samples->front().last_created_ns) / 1e9;
  const double steps_in_span =
      period > 0 ? static_cast<double>(last_seq->seq - first_seq->seq) / period : 0;
  StragglerEpisode episode;
  episode.group = *group;
  if (steps_in_span >= 1) {
    episode.step_s = span_s / steps_in_span;
  } else if (auto steps = steps_.find(*group); steps != steps_.end()) {
    std::vector<double> each;  // Too few steps in the window: the reporters' own figure.
    for (const auto& [rank, step] : steps->second) each.push_back(step);
    episode.step_s = median(std::move(each));
  }
  // The steps the samples hold: all of the span's, or of thinned arrivals, theirs.
  const double steps = period > 0 ? std::max(1.0, static_cast<double>(samples->size()) / period)
                                  : static_cast<double>(samples->size());
  // The time those steps took, which the others' waits are a share of.
  const double sampled_s = episode.step_s > 0 ? steps * episode.step_s : span_s;
  if (sampled_s <= 0) return std::nullopt;

  // Each collective's last arrival made the others wait: charge their wait to it. A step at which
  // it was last by the floor or more is one at which it held them back.
  const double floor = std::max(settings_.min_lag_s, settings_.min_step_share * episode.step_s);
  std::map<int, double> charged;
  std::map<int, std::vector<double>> late;  // Rank -> its lags where it held the others back.
  std::map<int, std::pair<int, int>> from_previous;  // Rank -> (late from the previous, known).
  double total_wait_s = 0;
  for (const Sample& sample : *samples) {
    charged[sample.last_rank] += sample.others_wait_s;
    total_wait_s += sample.others_wait_s;
    if (sample.lag_s < floor) continue;
    late[sample.last_rank].push_back(sample.lag_s);
    if (sample.late_from_previous) {
      from_previous[sample.last_rank].first += *sample.late_from_previous;
      ++from_previous[sample.last_rank].second;
    }
  }
  const auto costliest =
      std::max_element(charged.begin(), charged.end(),
                       [](const auto& a, const auto& b) { return a.second < b.second; });
  episode.rank = costliest->first;
  episode.cost_share = std::min(1.0, costliest->second / sampled_s);
  episode.wait_share = total_wait_s > 0 ? costliest->second / total_wait_s : 0;
  const std::vector<double>& its_lags = late[episode.rank];
  episode.collectives = static_cast<int>(its_lags.size());
  // A step holds several collectives (DDP's buckets, the loop's own), and a slow rank holds the
  // others back at the first it reaches after its slow part only: count steps, not collectives.
  episode.share = std::min(1.0, static_cast<double>(its_lags.size()) / steps);
  episode.median_lag_s = median(its_lags);
  spdlog::debug(
      "straggler watch: group {}, {} collectives over {:.1f} s, step {:.3f} s, floor {:.3f} s: "
      "rank {} cost the others {:.0f}% of the time ({:.0f}% of their waits) and held them "
      "back at {} ({:.0f}% of the steps)",
      *group, samples->size(), span_s, episode.step_s, floor, episode.rank,
      100 * episode.cost_share, 100 * episode.wait_share, its_lags.size(), 100 * episode.share);
  // Named when the others lose a real share of their time, to this rank above all, and not in a
  // rare event: an evaluation every 50 steps is the script's design.
  if (episode.cost_share < settings_.min_cost_share || episode.wait_share < kMostOfTheWaits ||
      episode.share < settings_.min_share || its_lags.size() < kMinLateSteps)
    return std::nullopt;
  Cause cause = cause_of(episode);
  // Late because the collective before finished last for it, at most steps where that is known,
  // with no cause of its own: a slow link on its ring, which the bandwidth watch names. A rank
  // that its quota freezes inside a collective finishes it last too, and is a straggler.
  if (const auto [previous, known] = from_previous[episode.rank];
      !cause.its_own && known > 0 && 2 * previous > known) {
    spdlog::debug(
        "straggler watch: rank {} arrived late because the previous collective finished last "
        "for it at {} of {} timed steps: a slow collective or link, not a straggler",
        episode.rank, previous, known);
    return std::nullopt;
  }
  if (auto info = ranks_.find(episode.rank); info != ranks_.end()) {
    episode.host = info->second.host;
    episode.local_rank = info->second.local_rank;
    episode.cause_pid = info->second.pid;
  }
  // No cause of its own while the collectives it is in crawl: a slow link delays the end of a
  // collective on some ranks more than others, and the bandwidth watch names that link.
  if (!cause.its_own && bandwidth_.runs_slow(episode.group, episode.rank)) {
    spdlog::debug(
        "straggler watch: rank {} is late with no cause of its own while its collectives "
        "on group {} run slow: theirs, not a straggler",
        episode.rank, episode.group);
    return std::nullopt;
  }
  episode.cause = std::move(cause.text);
  return episode;
}

std::string StragglerWatch::describe(const StragglerEpisode& episode, bool changed) const {
  std::string where = episode.host.empty() ? "" : "node " + episode.host;
  if (episode.local_rank >= 0)
    where += fmt::format("{}local rank {}", where.empty() ? "" : ", ", episode.local_rank);
  std::string text = fmt::format(
      "straggler{}: rank {}{} arrives last at {} of the {} on group {}, {} behind the "
      "others (median of {}, over {:.0f} s)",
      changed ? " now" : "", episode.rank, where.empty() ? "" : " (" + where + ")",
      percent(episode.share), episode.step_s > 0 ? "steps" : "collectives", episode.group,
      human_duration(episode.median_lag_s), episode.collectives, settings_.window_s);
  text += fmt::format("; the others spent {} of the last {:.0f} s waiting for rank {}",
                      percent(episode.cost_share), settings_.window_s, episode.rank);
  if (episode.step_s > 0) text += fmt::format(" (a step takes {})", human_duration(episode.step_s));
  return text + "; " + episode.cause;
}

std::optional<std::string> StragglerWatch::check(Clock::time_point now,
                                                 std::chrono::system_clock::time_point wall) {
  // By when the collectives happened, not when their arrivals were read (every few seconds).
  const int64_t wall_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(wall.time_since_epoch()).count();
  for (auto& [group, samples] : samples_) {
    std::sort(samples.begin(), samples.end(), [](const Sample& a, const Sample& b) {
      return a.last_created_ns < b.last_created_ns;
    });
    while (!samples.empty() &&
           static_cast<double>(wall_ns - samples.front().last_created_ns) / 1e9 >
               settings_.window_s)
      samples.pop_front();
  }
  std::optional<StragglerEpisode> found = judge(wall_ns);
  if (current_ && found && found->rank == episodes_.back().rank) {
    StragglerEpisode& ongoing = episodes_.back();
    const bool doubled = found->median_lag_s >= 2 * ongoing.median_lag_s;
    if (!doubled || (last_line_ && seconds_between(*last_line_, now) < settings_.window_s)) {
      ongoing.last_seen = wall;  // The same straggler, still: no new line.
      return std::nullopt;
    }
  }
  if (!found && !current_) return std::nullopt;
  // At most one line a window; what is left unsaid is said at the next chance.
  if (last_line_ && seconds_between(*last_line_, now) < settings_.window_s) return std::nullopt;
  last_line_ = now;
  if (!found) {
    current_ = false;
    const StragglerEpisode& ended = episodes_.back();
    return fmt::format(
        "straggler gone: rank {} no longer holds the others back (it did for {:.0f} s)", ended.rank,
        std::chrono::duration<double>(ended.last_seen - ended.first_seen).count() +
            settings_.window_s);
  }
  const bool changed = current_;
  found->first_seen = found->last_seen = wall;
  episodes_.push_back(*found);
  current_ = true;
  return describe(*found, changed);
}

}  // namespace mcprun
