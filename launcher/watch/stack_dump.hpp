// Native stack dumps of stalled workers, taken before mcprun kills them (Open MPI's
// --get-stack-traces, for PyTorch): py-spy or gdb per worker, all at once, each bounded.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/process/deadline.hpp"
#include "launcher/process/process_control.hpp"

namespace mcprun {

/// How long one dumper may run before it is SIGKILLed; gdb takes ~1.5 s on a process with torch
/// loaded, more when many run at once on few cores.
inline constexpr std::chrono::seconds kStackDumpTimeout{10};
/// How long a SIGKILLed dumper may take to exit before mcprun stops waiting for it (the
/// launcher's reap() still collects it later).
inline constexpr std::chrono::seconds kDumperKillTimeout = kKilledExitTimeout;

/// The program that takes the dumps: py-spy shows Python and native frames, gdb native only.
struct StackDumpTool {
  enum class Kind { kNone, kGdb, kPySpy };
  Kind kind = Kind::kNone;
  std::filesystem::path program;  ///< Absolute path; empty for kNone.

  /// "py-spy", "gdb" or "none", for the report.
  std::string name() const;
  /// The dumper's command line for `pid`; empty for kNone.
  std::vector<std::string> argv(pid_t pid) const;
  /// py-spy if on `search_path` (':'-separated, like PATH), else gdb, else kNone.
  static StackDumpTool find(std::string_view search_path);
  /// find() on the launcher's own PATH.
  static StackDumpTool find_on_path();
};

/// One process to dump, and the file that receives the dump.
struct StackDumpRequest {
  pid_t pid = 0;
  std::filesystem::path output;
};

/// Runs dumpers on the launcher's event loop. Dumpers are started through ProcessControl (own
/// process group, reaped like any child); each one's exit is learned from a pidfd, so it does not
/// matter whether the launcher's reap() or this class collects it. Linux >= 5.3.
class StackDumper {
 public:
  StackDumper(boost::asio::io_context& io, ProcessControl& control,
              StackDumpTool tool = StackDumpTool::find_on_path());
  /// Kills dumpers still running and resumes their targets; their batch's `done` never runs.
  ~StackDumper();
  StackDumper(const StackDumper&) = delete;
  StackDumper& operator=(const StackDumper&) = delete;

  /// Starts every dump at once; `done` runs on the loop once all have finished or timed out.
  /// Each output file starts with a header line (tool, pid, time); a dumper past `timeout` is
  /// SIGKILLed with its process group and its target is sent SIGCONT, so no dump leaves a
  /// worker stopped.
  void dump_all(std::vector<StackDumpRequest> requests, std::chrono::milliseconds timeout,
                std::function<void()> done);
  const StackDumpTool& tool() const { return tool_; }
  /// The tool a StackDumper on the launcher's PATH uses: "py-spy", "gdb" or "none".
  static std::string tool_description() { return StackDumpTool::find_on_path().name(); }

 private:
  struct Dump;  ///< One dumper process; shared with its handlers, which may outlive this.

  boost::asio::io_context& io_;
  ProcessControl& control_;
  StackDumpTool tool_;
  std::vector<std::weak_ptr<Dump>> dumps_;  ///< To stop any still running on destruction.
};

}  // namespace mcprun
