#include "common/process_state.hpp"

#include <fmt/format.h>

#include <fstream>
#include <iterator>

namespace mcprun {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

std::optional<ProcessRunState> parse_run_state(std::string_view stat, std::string_view wchan) {
  // "PID (COMM) S ...": COMM is the process's to choose, so the state follows the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string_view::npos || close + 2 >= stat.size() || stat[close + 1] != ' ')
    return std::nullopt;
  ProcessRunState state;
  state.state = stat[close + 2];
  state.wchan = std::string(wchan.substr(0, wchan.find_first_of("\n")));
  if (state.wchan == "0") state.wchan.clear();
  return state;
}

std::optional<ProcessRunState> read_run_state(pid_t pid) {
  const std::string dir = fmt::format("/proc/{}/", pid);
  const std::string stat = read_text(dir + "stat");
  if (stat.empty()) return std::nullopt;
  return parse_run_state(stat, read_text(dir + "wchan"));
}

std::optional<std::string> describe_not_running(const ProcessRunState& state) {
  const std::string in = state.wchan.empty() ? "" : " in " + state.wchan;
  switch (state.state) {
    case 'T':
      return "stopped (state T: SIGSTOP, SIGTSTP or a job-control stop), so it runs nothing";
    case 't':
      return "stopped by a debugger (state t, traced), so it runs nothing";
    case 'D':
      return "in uninterruptible sleep (state D" + in +
             "): blocked in the kernel, as on a hung network mount, a device or swap";
    default:
      // cgroup v2's freezer parks a task in an interruptible sleep in this function.
      if (state.wchan == "do_freezer_trap") return "frozen by its cgroup's freezer (cgroup.freeze)";
      return std::nullopt;
  }
}

}  // namespace mcprun
