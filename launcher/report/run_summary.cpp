#include "launcher/report/run_summary.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/details/null_mutex.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "common/exit_status.hpp"
#include "common/sys.hpp"
#include "common/unique_fd.hpp"
#include "common/version.hpp"
#include "launcher/process/process_control.hpp"

namespace mcprun {

/// Keeps the last error mcprun logged: the root cause of an ending that no attempt explains (no
/// GPU lease, no port, a rendezvous that failed), whichever return path of launch() it took.
class LastErrorSink final : public spdlog::sinks::base_sink<spdlog::details::null_mutex> {
 public:
  std::string message;

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (msg.level >= spdlog::level::err) message.assign(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {}
};

namespace {

double seconds_between(std::chrono::system_clock::time_point from,
                       std::chrono::system_clock::time_point to) {
  return std::max(0.0, std::chrono::duration<double>(to - from).count());
}

double round_ms(double seconds) {
  return static_cast<double>(static_cast<long>(seconds * 1000 + 0.5)) / 1000;
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

/// Where `path` is written first, then renamed over it.
std::string temp_path_for(const std::filesystem::path& path) {
  return path.string() + ".tmp." + std::to_string(::getpid());
}

/// Replaces `path` in one step, so that CI never reads half a file.
std::optional<std::string> write_atomically(const std::filesystem::path& path,
                                            const std::string& text) {
  if (path.has_parent_path())
    if (auto made = make_folders(path.parent_path()); !made) return made.error().message;
  const std::string temp = temp_path_for(path);
  UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666));
  if (!fd.valid()) return "open(" + temp + "): " + std::strerror(errno);
  for (size_t done = 0; done < text.size();) {
    const ssize_t written = ::write(fd.get(), text.data() + done, text.size() - done);
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) {
      const std::string error = "write(" + temp + "): " + std::strerror(errno);
      ::unlink(temp.c_str());
      return error;
    }
    done += static_cast<size_t>(written);
  }
  fd.reset();
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string error =
        "rename(" + temp + ", " + path.string() + "): " + std::strerror(errno);
    ::unlink(temp.c_str());
    return error;
  }
  return std::nullopt;
}

/// What write_atomically() will need, tried now: the folder made, a file created in it.
Expected<void> try_writing(const char* flag, const std::filesystem::path& path) {
  const std::filesystem::path folder = path.has_parent_path() ? path.parent_path() : ".";
  if (auto made = make_folders(folder); !made)
    return Error{std::string(flag) + " " + path.string() + ": " + made.error().message};
  const std::string temp = temp_path_for(path);
  UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
  if (!fd.valid())
    return Error{std::string(flag) + " " + path.string() + ": cannot write in " + folder.string() +
                 ": " + std::strerror(errno)};
  ::unlink(temp.c_str());
  return {};
}

/// The exit code mcprun returns when `result` is how the job ended.
int exit_code_of(const AttemptResult& result, const std::vector<WorkerOutcome>& workers) {
  switch (result.end) {
    case AttemptResult::End::kSucceeded:
      return kExitSuccess;
    case AttemptResult::End::kWorkerFailed:
      return exit_code_for(workers.at(result.first_failure));
    case AttemptResult::End::kStalled:
      return kExitStalled;
    case AttemptResult::End::kPeerStopped:
      return result.peer_exit_code;
    case AttemptResult::End::kInterrupted:
      return exit_code_for_signal(result.interrupt_signal);
    case AttemptResult::End::kSpawnFailed:
      return kExitFailure;
  }
  return kExitFailure;
}

}  // namespace

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const char* reference = c == '&'    ? "&amp;"
                            : c == '<'  ? "&lt;"
                            : c == '>'  ? "&gt;"
                            : c == '"'  ? "&quot;"
                            : c == '\'' ? "&apos;"
                            : c == '\t' ? "&#9;"
                            : c == '\n' ? "&#10;"
                            : c == '\r' ? "&#13;"
                                        : nullptr;
    if (reference) {
      out += reference;
      ++i;
      continue;
    }
    const size_t length = c < 0x80           ? 1
                          : (c >> 5) == 0x6  ? 2
                          : (c >> 4) == 0xE  ? 3
                          : (c >> 3) == 0x1E ? 4
                                             : 0;
    bool valid = length != 0 && i + length <= text.size();
    char32_t code_point = length == 1   ? c
                          : length == 2 ? c & 0x1F
                          : length == 3 ? c & 0x0F
                                        : c & 0x07;
    for (size_t k = 1; valid && k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      valid = (next & 0xC0) == 0x80;
      code_point = (code_point << 6) | (next & 0x3F);
    }
    // Overlong forms, surrogates and what XML 1.0 excludes: C0 controls, U+FFFE and U+FFFF.
    constexpr char32_t kShortest[] = {0, 0, 0x80, 0x800, 0x10000};
    valid = valid && code_point >= kShortest[length] && code_point >= 0x20 &&
            code_point <= 0x10FFFF && !(code_point >= 0xD800 && code_point <= 0xDFFF) &&
            code_point != 0xFFFE && code_point != 0xFFFF;
    if (!valid) {
      out += fmt::format("\\x{:02x}", c);
      ++i;
      continue;
    }
    out.append(text.substr(i, length));
    i += length;
  }
  return out;
}

RunSummary::RunSummary(const LaunchConfig& config, std::string host)
    : active_(!config.dry_run && (!config.summary_json.empty() || !config.junit.empty())),
      host_(std::move(host)),
      rdzv_id_(config.rdzv_id),
      summary_json_(config.summary_json),
      junit_(config.junit),
      job_timeout_(config.job_timeout),
      under_slurm_(config.under_slurm),
      started_(std::chrono::system_clock::now()),
      started_steady_(std::chrono::steady_clock::now()),
      attempt_started_(started_) {
  if (!active_) return;
  last_error_ = std::make_shared<LastErrorSink>();
  spdlog::default_logger()->sinks().push_back(last_error_);
}

RunSummary::~RunSummary() {
  if (!last_error_) return;
  auto& sinks = spdlog::default_logger()->sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), last_error_), sinks.end());
}

nlohmann::ordered_json RunSummary::stragglers_json() const {
  auto stragglers = nlohmann::ordered_json::array();
  for (const StragglerEpisode& straggler : stragglers_)
    stragglers.push_back({{"rank", straggler.rank},
                          {"node", straggler.host},
                          {"local_rank", straggler.local_rank},
                          {"group", straggler.group},
                          {"first_seen", utc_timestamp(straggler.first_seen)},
                          {"last_seen", utc_timestamp(straggler.last_seen)},
                          {"median_lag_s", round_ms(straggler.median_lag_s)},
                          {"share", std::round(straggler.share * 1000) / 1000},
                          {"cost_share", std::round(straggler.cost_share * 1000) / 1000},
                          {"wait_share", std::round(straggler.wait_share * 1000) / 1000},
                          {"collectives", straggler.collectives},
                          {"step_s", round_ms(straggler.step_s)},
                          {"cause", straggler.cause}});
  return stragglers;
}

nlohmann::ordered_json RunSummary::slow_collectives_json() const {
  auto slow = nlohmann::ordered_json::array();
  for (const SlowCollective& collective : slow_collectives_)
    slow.push_back({{"group", collective.group},
                    {"op", collective.op},
                    {"size", collective.size},
                    {"ranks", collective.ranks},
                    {"first_seen", utc_timestamp(collective.first_seen)},
                    {"last_seen", utc_timestamp(collective.last_seen)},
                    {"busbw_before", collective.busbw_before},
                    {"busbw_before_from", collective.before_is_preflight ? "preflight" : "earlier"},
                    {"busbw", collective.busbw_now},
                    {"mean_s", round_ms(collective.mean_s)},
                    {"busy_share", std::round(collective.busy_share * 1000) / 1000}});
  return slow;
}

void RunSummary::begin_attempt() {
  attempt_started_ = std::chrono::system_clock::now();
  hint_.clear();
  early_finisher_.reset();
}

void RunSummary::end_attempt(const AttemptResult& result, const AttemptFiles& files,
                             int world_size) {
  ++attempts_;
  world_size_ = world_size;
  ranks_.clear();
  for (const WorkerOutcome& worker : result.workers) {
    Rank& rank = ranks_.emplace_back();
    rank.outcome = worker;
    if (!active_) continue;
    rank.recorded = read_error_file(worker.error_file);
    if (worker.pid > 0) rank.duration_s = seconds_between(attempt_started_, worker.exit_time);
    if (files.keep_logs) {
      const auto dir =
          std::filesystem::absolute(files.attempt_dir / std::to_string(worker.local_rank));
      rank.stdout_log = dir / "stdout.log";
      rank.stderr_log = dir / "stderr.log";
    }
  }
  last_ = result;
  last_->workers.clear();
}

const RankProgress* RunSummary::stall_progress(int rank) const {
  if (!last_ || last_->end != AttemptResult::End::kStalled) return nullptr;
  auto found = std::find_if(stall_ranks.begin(), stall_ranks.end(),
                            [&](const RankProgress& progress) { return progress.rank == rank; });
  return found == stall_ranks.end() ? nullptr : &*found;
}

bool RunSummary::stalled(int rank) const {
  const RankProgress* progress = stall_progress(rank);
  return progress && progress->level < furthest_level(stall_ranks);
}

bool RunSummary::root_cause(size_t index) const {
  return last_ && last_->end == AttemptResult::End::kWorkerFailed && last_->first_failure == index;
}

std::string RunSummary::rank_ending(const Rank& rank) const {
  const WorkerOutcome& worker = rank.outcome;
  std::string text = "rank " + std::to_string(worker.rank) + " on " + host_ +
                     (worker.signal != 0 ? " died of " : " exited with ") +
                     describe_exit(worker.exit_code, worker.signal);
  // What @record wrote, else the rank's last line: usually the exception a traceback ends with.
  const std::string detail = first_line(rank.recorded         ? rank.recorded->message
                                        : worker.tail.empty() ? std::string()
                                                              : worker.tail.back());
  return detail.empty() ? text : text + ": " + detail;
}

RunSummary::Verdict RunSummary::verdict(int exit_code) const {
  if (under_slurm_ && exit_code == kExitSlurmCancelled)
    return {"cancelled", "cancelled by Slurm (SIGTERM: scancel, the time limit or preemption)"};
  std::vector<WorkerOutcome> workers;
  for (const Rank& rank : ranks_) workers.push_back(rank.outcome);
  if (last_ && exit_code_of(*last_, workers) == exit_code) {
    switch (last_->end) {
      case AttemptResult::End::kSucceeded:
        return {"success", ""};
      case AttemptResult::End::kWorkerFailed:
        return {"failed", rank_ending(ranks_.at(last_->first_failure))};
      case AttemptResult::End::kStalled:
        return {"stalled", last_->stall ? last_->stall->what : "a stall"};
      case AttemptResult::End::kPeerStopped:
        return {last_->peer_exit_code == kExitJobTimeout ? "timeout" : "failed",
                last_->peer_reason};
      case AttemptResult::End::kInterrupted:
        return {"interrupted",
                "mcprun was interrupted by " + describe_exit(0, last_->interrupt_signal)};
      case AttemptResult::End::kSpawnFailed:
        return {"failed", "cannot start a worker: " + last_->spawn_error};
    }
  }
  // The job ended outside an attempt: before the first, or between two.
  const std::string logged = last_error_ ? last_error_->message : "";
  if (exit_code == kExitSuccess) return {"success", ""};
  if (exit_code == kExitJobTimeout)
    return {"timeout", fmt::format("the job ran past --timeout {} s", job_timeout_)};
  if (exit_code > kExitSignalBase && exit_code < kExitSignalBase + 65)
    return {"interrupted",
            "mcprun was interrupted by " + describe_exit(0, exit_code - kExitSignalBase)};
  if (exit_code == kExitPreflightFailed && preflight_.is_object())
    return {"failed", "preflight: " + preflight_.value("verdict", std::string("failed"))};
  if (exit_code == kExitRendezvous)
    return {"failed", logged.empty() ? "the rendezvous failed or a node was lost"
                                     : "rendezvous failed: " + logged};
  if (!logged.empty()) return {"failed", logged};
  return {"failed", exit_code == kExitUsage ? "usage error (see mcprun's stderr)"
                                            : "mcprun exited " + std::to_string(exit_code)};
}

nlohmann::ordered_json RunSummary::format_json(int exit_code) const {
  const Verdict ending = verdict(exit_code);
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& rank = ranks_[i];
    const WorkerOutcome& worker = rank.outcome;
    nlohmann::ordered_json entry{
        {"rank", worker.rank}, {"local_rank", worker.local_rank}, {"pid", worker.pid}};
    if (worker.pid == 0)
      entry["exit_code"] = nullptr;  // Never started.
    else if (worker.signal != 0)
      entry["signal"] = {{"name", signal_name(worker.signal)}, {"number", worker.signal}};
    else
      entry["exit_code"] = worker.exit_code;
    entry["duration_s"] = round_ms(rank.duration_s);
    entry["log"] = rank.stdout_log.empty()
                       ? nlohmann::ordered_json(nullptr)
                       : nlohmann::ordered_json{{"stdout", rank.stdout_log.string()},
                                                {"stderr", rank.stderr_log.string()}};
    entry["stalled"] = stalled(worker.rank);
    entry["root_cause"] = root_cause(i);
    entry["stopped_by_mcprun"] = worker.stopped_by_launcher;
    if (const RankProgress* progress = stall_progress(worker.rank);
        progress && !progress->stack_file.empty())
      entry["stack_dump"] = progress->stack_file;
    if (const RankProgress* progress = stall_progress(worker.rank);
        progress && !progress->hint.empty())
      entry["hint"] = progress->hint;
    ranks.push_back(std::move(entry));
  }
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_steady_).count();
  return {
      {"result", ending.result},
      {"exit_code", exit_code},
      {"root_cause", ending.root_cause.empty() ? nlohmann::ordered_json(nullptr)
                                               : nlohmann::ordered_json(ending.root_cause)},
      // What the failure's error means for this job, when a known signature matched.
      {"hint", !hint_.empty() && (ending.result == "failed" || ending.result == "stalled")
                   ? nlohmann::ordered_json(hint_)
                   : nlohmann::ordered_json(nullptr)},
      // A rank that exited 0 just before the failing rank lost its peer: the likely cause.
      {"early_finisher",
       early_finisher_ && ending.result == "failed"
           ? nlohmann::ordered_json{{"rank", early_finisher_->rank},
                                    {"exit_code", early_finisher_->exit_code_known
                                                      ? nlohmann::ordered_json(0)
                                                      : nlohmann::ordered_json(nullptr)},
                                    {"seconds_before_failure",
                                     round_ms(early_finisher_->seconds_before)}}
           : nlohmann::ordered_json(nullptr)},
      // Who held the others back while the job ran (the straggler watch), oldest first.
      {"stragglers", stragglers_json()},
      {"slow_collectives", slow_collectives_json()},
      {"world_size", last_ ? nlohmann::ordered_json(world_size_) : nlohmann::ordered_json(nullptr)},
      {"restarts", std::max(0, attempts_ - 1)},
      {"total_time_s", round_ms(total)},
      {"started_at", utc_timestamp(started_)},
      {"host", host_},
      {"rdzv_id", rdzv_id_},
      {"mcprun_version", mcprun_version()},
      // What stalled, as every node heard it: for a collective, its group, op, sequence number,
      // backend, age, and where each rank was.
      {"stall", last_ && last_->stall && ending.result == "stalled"
                    ? nlohmann::ordered_json::parse(to_json(*last_->stall).dump())
                    : nlohmann::ordered_json(nullptr)},
      // The check before the script: table, figures, faults, verdict and bandwidth floor.
      {"preflight", nlohmann::ordered_json::parse(preflight_.dump())},
      {"ranks", std::move(ranks)}};
}

namespace {

/// A JUnit suite's test cases as they are written, counting failures and skips.
class JunitCases {
 public:
  /// `suite` is escaped already; `failure_type` is the job's result word.
  JunitCases(std::string suite, std::string failure_type)
      : suite_(std::move(suite)), failure_type_(std::move(failure_type)) {}

  void passed(const std::string& name, double seconds) {
    open(name, seconds);
    cases_ << "/>\n";
  }
  void skipped(const std::string& name, double seconds, const std::string& message) {
    ++skipped_;
    open(name, seconds);
    cases_ << ">\n    <skipped message=\"" << xml_escape(message) << "\"/>\n  </testcase>\n";
  }
  void failed(const std::string& name, double seconds, const std::string& message,
              const std::vector<std::string>& body) {
    ++failures_;
    open(name, seconds);
    cases_ << ">\n    <failure message=\"" << xml_escape(message) << "\" type=\"" << failure_type_
           << "\">";
    for (size_t i = 0; i < body.size(); ++i) cases_ << (i ? "\n" : "") << xml_escape(body[i]);
    cases_ << "</failure>\n  </testcase>\n";
  }
  int failures() const { return failures_; }
  int skipped() const { return skipped_; }
  std::string text() const { return cases_.str(); }

 private:
  void open(const std::string& name, double seconds) {
    cases_ << fmt::format("  <testcase classname=\"{}\" name=\"{}\" time=\"{:.3f}\"", suite_,
                          xml_escape(name), seconds);
  }

  std::string suite_, failure_type_;
  std::ostringstream cases_;
  int failures_ = 0, skipped_ = 0;
};

/// A failed or stalled rank's <failure> text: how it ended, the error torch's @record wrote,
/// where the stall found it, and its last lines of output.
std::vector<std::string> rank_failure_body(const WorkerOutcome& worker,
                                           const std::optional<RecordedError>& recorded,
                                           const RankProgress* progress, const std::string& host) {
  std::vector<std::string> body{fmt::format(
      "rank {} (local rank {}, pid {}) on {}: {}", worker.rank, worker.local_rank, worker.pid, host,
      worker.pid == 0 ? "never started"
      : worker.stopped_by_launcher
          ? "stopped by mcprun, " + describe_exit(worker.exit_code, worker.signal)
          : describe_exit(worker.exit_code, worker.signal))};
  if (recorded) {
    body.push_back("error: " + recorded->message);
    std::istringstream traceback(recorded->traceback);
    for (std::string line; std::getline(traceback, line);) body.push_back("  " + line);
  }
  if (progress) {
    body.push_back("at the stall: " + progress->state);
    if (!progress->stack_file.empty()) body.push_back("stack dump: " + progress->stack_file);
  }
  body.push_back("last output (" + std::to_string(worker.tail.size()) + " lines):");
  for (const std::string& line : worker.tail) body.push_back("  " + line);
  return body;
}

}  // namespace

std::string RunSummary::format_junit(int exit_code) const {
  const Verdict ending = verdict(exit_code);
  const std::string suite = xml_escape("mcprun." + rdzv_id_);
  bool culprit_here =
      false;  // A rank of this node failed or stalled: the others it stopped are skipped.
  for (const Rank& rank : ranks_)
    culprit_here |=
        (rank.outcome.failed() && !rank.outcome.stopped_by_launcher) || stalled(rank.outcome.rank);

  JunitCases cases(suite, ending.result);
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& rank = ranks_[i];
    const WorkerOutcome& worker = rank.outcome;
    const bool failed_itself = worker.failed() && !worker.stopped_by_launcher;
    const bool was_stalled = stalled(worker.rank);
    const std::string name = "rank " + std::to_string(worker.rank);
    if (ending.result == "success" ||
        (worker.pid > 0 && !worker.failed() && !worker.stopped_by_launcher))
      cases.passed(name, rank.duration_s);
    else if (!failed_itself && !was_stalled && culprit_here)
      cases.skipped(name, rank.duration_s, "stopped by mcprun: " + ending.root_cause);
    else
      cases.failed(name, rank.duration_s,
                   failed_itself && !root_cause(i) ? rank_ending(rank) : ending.root_cause,
                   rank_failure_body(worker, rank.recorded, stall_progress(worker.rank), host_));
  }
  // An ending no rank accounts for (a rendezvous that failed, no rank ever started) still fails.
  const bool launch_case = ending.result != "success" && cases.failures() == 0;
  if (launch_case)
    cases.failed(
        "mcprun",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_steady_).count(),
        ending.root_cause,
        {"mcprun exited " + std::to_string(exit_code) + ": " + ending.root_cause});

  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_steady_).count();
  const int tests = static_cast<int>(ranks_.size()) + (launch_case ? 1 : 0);
  std::ostringstream out;
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << fmt::format(
             "<testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{}\" "
             "time=\"{:.3f}\" timestamp=\"{}\" hostname=\"{}\">\n",
             suite, tests, cases.failures(), cases.skipped(), total, utc_timestamp(started_),
             xml_escape(host_))
      << cases.text() << "</testsuite>\n";
  return out.str();
}

Expected<void> RunSummary::check_writable() const {
  if (!active_) return {};
  if (!summary_json_.empty())
    if (auto ok = try_writing("--summary-json", summary_json_); !ok) return ok;
  if (!junit_.empty())
    if (auto ok = try_writing("--junit", junit_); !ok) return ok;
  return {};
}

void RunSummary::write(int exit_code) const {
  if (!active_) return;
  if (!summary_json_.empty()) {
    // Output with invalid UTF-8 in a root cause must not cost the whole summary.
    const std::string text = format_json(exit_code).dump(
                                 2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) +
                             "\n";
    if (auto error = write_atomically(summary_json_, text))
      spdlog::error("cannot write --summary-json: {}", *error);
  }
  if (!junit_.empty())
    if (auto error = write_atomically(junit_, format_junit(exit_code)))
      spdlog::error("cannot write --junit: {}", *error);
}

}  // namespace mcprun
