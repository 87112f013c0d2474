#include "common/process_state.hpp"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <filesystem>

#include <fstream>
#include <iterator>
#include <vector>

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

std::optional<std::string> busiest_process_beside(pid_t pid) {
  cpu_set_t allowed;
  if (sched_getaffinity(pid, sizeof allowed, &allowed) != 0) return std::nullopt;
  const pid_t own_group = getpgid(pid);
  const double ticks_per_s = static_cast<double>(sysconf(_SC_CLK_TCK));
  double uptime_s = 0;
  std::ifstream("/proc/uptime") >> uptime_s;
  std::optional<std::string> busiest;
  double busiest_share = 0.1;  // Less is background noise, not a hog.
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t other = std::stoi(name);
    if (other == pid || getpgid(other) == own_group) continue;
    const std::string stat = read_text(entry.path().string() + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] != 'R') continue;
    // Fields after the command: state is 0, utime 11, stime 12, starttime 19.
    std::vector<std::string> fields;
    for (size_t at = close + 2; at < stat.size();) {
      const size_t end = stat.find(' ', at);
      fields.push_back(stat.substr(at, end - at));
      if (end == std::string::npos) break;
      at = end + 1;
    }
    if (fields.size() < 20) continue;
    cpu_set_t its;
    bool shares = false;
    if (sched_getaffinity(other, sizeof its, &its) == 0) {
      cpu_set_t both;
      CPU_AND(&both, &allowed, &its);
      shares = CPU_COUNT(&both) > 0;
    }
    if (!shares) continue;
    const double alive_s = uptime_s - std::stod(fields[19]) / ticks_per_s;
    if (alive_s < 1) continue;
    const double share = (std::stod(fields[11]) + std::stod(fields[12])) / ticks_per_s / alive_s;
    if (share <= busiest_share) continue;
    busiest_share = share;
    const std::string command = stat.substr(stat.find('(') + 1, close - stat.find('(') - 1);
    busiest = fmt::format("pid {} ({}) at {:.0f}% of a CPU", other, command, 100 * share);
  }
  return busiest;
}

}  // namespace mcprun
