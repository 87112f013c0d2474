// A ProcessControl without processes, in the manner of ninja's FakeCommandRunner: it records every
// spawn and every signal, and the test decides when and how each "process" ends (an exit code or
// a signal). Supervision then runs its real policy with time and the OS out of the way.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "launcher/process/process_control.hpp"

namespace mcprun::testing {

/// How a fake process ends: an exit code, or death by a signal.
struct FakeEnding {
  int exit_code = 0;
  int signal = 0;
  static FakeEnding exits(int exit_code) { return {exit_code, 0}; }
  static FakeEnding killed_by(int signal) { return {0, signal}; }
};

/// One signal the launcher sent, in the order it sent them.
struct SentSignal {
  enum class To { kGroup, kProcess, kOrphans };
  To to;
  pid_t pid;  ///< The group's leader or the process; 0 for orphans.
  int signal;
  bool operator==(const SentSignal&) const = default;
};

inline SentSignal to_group(pid_t leader, int signal) {
  return {SentSignal::To::kGroup, leader, signal};
}
inline SentSignal to_process(pid_t pid, int signal) {
  return {SentSignal::To::kProcess, pid, signal};
}
inline SentSignal to_orphans(int signal) { return {SentSignal::To::kOrphans, 0, signal}; }

inline std::ostream& operator<<(std::ostream& out, const SentSignal& sent) {
  const char* to = sent.to == SentSignal::To::kGroup     ? "group "
                   : sent.to == SentSignal::To::kProcess ? "process "
                                                         : "orphans";
  out << strsignal(sent.signal) << " to " << to;
  if (sent.to != SentSignal::To::kOrphans) out << sent.pid;
  return out;
}

class FakeProcessControl final : public ProcessControl {
 public:
  /// Above Linux's largest pid_max (2^22): a real syscall on a fake pid (the stack dumper's
  /// pidfd_open) fails with ESRCH instead of reaching a real process.
  static constexpr pid_t kFirstPid = 10'000'000;

  struct Process {
    pid_t pid = 0;
    SpawnRequest request;
    bool orphan = false;               ///< Adopted, not spawned: only signal_orphans reaches it.
    std::optional<ProcessExit> ended;  ///< Set once it has ended.
    bool reaped = false;
    /// Its own reactions to signals; nullopt: it ignores that signal.
    std::map<int, std::optional<FakeEnding>> reactions;
    bool running() const { return !ended; }
  };

  // ---- What the test decides.

  /// How every process, spawned now or later, reacts to `signal` unless told otherwise: nullopt
  /// ignores it. Without a word, a process reacts as to the default disposition.
  void on_signal(int signal, std::optional<FakeEnding> ending) { reactions_[signal] = ending; }
  /// How process `pid` alone reacts to `signal`.
  void on_signal(pid_t pid, int signal, std::optional<FakeEnding> ending) {
    find(pid).reactions[signal] = ending;
  }
  /// The `index`th spawn (0-based, counted over the fake's life) fails with `error`.
  void fail_spawn(size_t index, std::string error) { spawn_failures_[index] = std::move(error); }
  /// Runs after each successful spawn with its pid and index, before spawn() returns.
  std::function<void(pid_t pid, size_t index)> after_spawn;
  /// Runs after each signal is recorded and has taken effect.
  std::function<void(const SentSignal&)> after_signal;

  /// Process `pid` exits with `exit_code` on its own.
  void exit(pid_t pid, int exit_code) { end(pid, FakeEnding::exits(exit_code)); }
  /// Process `pid` dies of a `signal` the launcher did not send (a crash, the OOM killer).
  void die(pid_t pid, int signal) { end(pid, FakeEnding::killed_by(signal)); }
  void end(pid_t pid, FakeEnding ending) {
    Process& ended = find(pid);
    if (ended.ended) throw std::logic_error("fake process " + std::to_string(pid) + " ended twice");
    ended.ended = ProcessExit{pid, ending.exit_code, ending.signal};
    if (listener_) listener_();
  }
  /// A grandchild whose parent died, now the launcher's child: only signal_orphans reaches it.
  pid_t adopt_orphan() {
    Process& orphan = processes_.emplace_back();
    orphan.pid = next_pid_++;
    orphan.orphan = true;
    return orphan.pid;
  }

  // ---- What the test observes.

  const std::deque<Process>& processes() const { return processes_; }
  /// The pids spawned, in order (orphans not included).
  std::vector<pid_t> spawned() const {
    std::vector<pid_t> pids;
    for (const Process& each : processes_)
      if (!each.orphan) pids.push_back(each.pid);
    return pids;
  }
  const Process& process(pid_t pid) const {
    for (const Process& each : processes_)
      if (each.pid == pid) return each;
    throw std::logic_error("no fake process " + std::to_string(pid));
  }
  /// The value `name` has in the environment process `pid` was started with; nullopt if unset.
  std::optional<std::string> env(pid_t pid, const std::string& name) const {
    for (const std::string& entry : process(pid).request.env)
      if (entry.rfind(name + "=", 0) == 0) return entry.substr(name.size() + 1);
    return std::nullopt;
  }
  const std::vector<SentSignal>& signals() const { return signals_; }
  /// Every signal sent to the group led by `pid` or to `pid` alone, in order.
  std::vector<int> signals_to(pid_t pid) const {
    std::vector<int> sent;
    for (const SentSignal& each : signals_)
      if (each.pid == pid) sent.push_back(each.signal);
    return sent;
  }
  bool all_reaped() const {
    for (const Process& each : processes_)
      if (!each.reaped) return false;
    return true;
  }
  bool has_exit_listener() const { return static_cast<bool>(listener_); }

  // ---- ProcessControl.

  Expected<pid_t> spawn(const SpawnRequest& request) override {
    const size_t index = spawn_count_++;
    if (auto failure = spawn_failures_.find(index); failure != spawn_failures_.end())
      return Error{failure->second};
    Process& spawned = processes_.emplace_back();
    spawned.pid = next_pid_++;
    spawned.request = request;
    const pid_t pid = spawned.pid;
    if (after_spawn) after_spawn(pid, index);
    return pid;
  }
  void signal_group(pid_t pgid, int signal) override {
    deliver(to_group(pgid, signal),
            [&](const Process& each) { return !each.orphan && each.pid == pgid; });
  }
  void signal_process(pid_t pid, int signal) override {
    deliver(to_process(pid, signal), [&](const Process& each) { return each.pid == pid; });
  }
  void signal_orphans(int signal) override {
    deliver(to_orphans(signal), [](const Process& each) { return each.orphan; });
  }
  std::vector<ProcessExit> reap() override {
    std::vector<ProcessExit> exits;
    for (Process& each : processes_) {
      if (!each.ended || each.reaped) continue;
      each.reaped = true;
      exits.push_back(*each.ended);
    }
    return exits;
  }
  std::optional<ProcessExit> reap_one(pid_t pid) override {
    for (Process& each : processes_) {
      if (each.pid != pid || !each.ended || each.reaped) continue;
      each.reaped = true;
      return each.ended;
    }
    return std::nullopt;
  }
  bool has_children() override { return !all_reaped(); }
  void set_exit_listener(std::function<void()> listener) override {
    listener_ = std::move(listener);
  }

 private:
  Process& find(pid_t pid) { return const_cast<Process&>(std::as_const(*this).process(pid)); }

  /// What `signal` does to `process`: its own reaction, else the fake-wide one, else the
  /// default disposition (SIGKILL and SIGSTOP cannot be caught or ignored).
  std::optional<FakeEnding> reaction(const Process& target, int signal) const {
    if (signal == SIGKILL) return FakeEnding::killed_by(SIGKILL);
    if (auto own = target.reactions.find(signal); own != target.reactions.end()) return own->second;
    if (auto common = reactions_.find(signal); common != reactions_.end()) return common->second;
    switch (signal) {
      case SIGCHLD:
      case SIGCONT:
      case SIGURG:
      case SIGWINCH:  // Ignored by default.
      case SIGSTOP:
      case SIGTSTP:
      case SIGTTIN:
      case SIGTTOU:  // Stop: the fake never stops.
        return std::nullopt;
      default:
        return FakeEnding::killed_by(signal);
    }
  }

  template <class Reached>
  void deliver(const SentSignal& sent, Reached reached) {
    signals_.push_back(sent);
    for (Process& each : processes_) {
      if (!reached(each) || each.ended) continue;
      if (auto ending = reaction(each, sent.signal)) end(each.pid, *ending);
    }
    if (after_signal) after_signal(sent);
  }

  std::deque<Process> processes_;  ///< A deque: references stay valid as processes are added.
  std::vector<SentSignal> signals_;
  std::map<int, std::optional<FakeEnding>> reactions_;
  std::map<size_t, std::string> spawn_failures_;
  std::function<void()> listener_;
  pid_t next_pid_ = kFirstPid;
  size_t spawn_count_ = 0;
};

}  // namespace mcprun::testing
