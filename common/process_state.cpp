#include "common/process_state.hpp"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <tuple>
#include <vector>

namespace mcprun {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// /proc/PID/stat's fields after the command name, the state first; empty for text that is not
/// a stat line. The command is the process's to choose (spaces, parentheses): it ends at the
/// last ')'.
std::vector<std::string_view> fields_after_command(std::string_view stat) {
  const size_t close = stat.rfind(')');
  if (close == std::string_view::npos || close + 2 >= stat.size() || stat[close + 1] != ' ')
    return {};
  std::vector<std::string_view> fields;
  for (size_t at = close + 2; at < stat.size();) {
    const size_t end = stat.find_first_of(" \n", at);
    fields.push_back(stat.substr(at, end - at));
    if (end == std::string_view::npos) break;
    at = end + 1;
  }
  return fields;
}

/// Fields after the command: state 0, utime 11, stime 12, starttime 19.
double field_ticks(const std::vector<std::string_view>& fields, size_t index) {
  double ticks = 0;
  if (index < fields.size())
    std::from_chars(fields[index].data(), fields[index].data() + fields[index].size(), ticks);
  return ticks;
}

}  // namespace

std::optional<ProcessRunState> parse_run_state(std::string_view stat, std::string_view wchan) {
  const std::vector<std::string_view> fields = fields_after_command(stat);
  if (fields.empty() || fields[0].empty()) return std::nullopt;
  ProcessRunState state;
  state.state = fields[0][0];
  state.wchan = std::string(wchan.substr(0, wchan.find_first_of("\n")));
  if (state.wchan == "0") state.wchan.clear();
  state.cpu_s = (field_ticks(fields, 11) + field_ticks(fields, 12)) /
                static_cast<double>(sysconf(_SC_CLK_TCK));
  return state;
}

std::optional<ProcessRunState> read_run_state(pid_t pid) {
  const std::string dir = fmt::format("/proc/{}/", pid);
  const std::string stat = read_text(dir + "stat");
  if (stat.empty()) return std::nullopt;
  return parse_run_state(stat, read_text(dir + "wchan"));
}

std::optional<std::pair<double, double>> parse_schedstat(std::string_view text) {
  uint64_t run_ns = 0, wait_ns = 0;
  const char* const end = text.data() + text.size();
  auto [after_run, run_error] = std::from_chars(text.data(), end, run_ns);
  if (run_error != std::errc() || after_run == end || *after_run != ' ') return std::nullopt;
  if (std::from_chars(after_run + 1, end, wait_ns).ec != std::errc()) return std::nullopt;
  return std::pair{static_cast<double>(run_ns) / 1e9, static_cast<double>(wait_ns) / 1e9};
}

std::optional<int64_t> parse_io_bytes(std::string_view text) {
  auto counter = [text](std::string_view name) -> std::optional<int64_t> {
    for (size_t at = 0; at < text.size();) {
      const size_t end = std::min(text.find('\n', at), text.size());
      const std::string_view line = text.substr(at, end - at);
      if (line.starts_with(name) && line.substr(name.size()).starts_with(": ")) {
        int64_t value = 0;
        const std::string_view digits = line.substr(name.size() + 2);
        if (std::from_chars(digits.data(), digits.data() + digits.size(), value).ec != std::errc())
          return std::nullopt;
        return value;
      }
      at = end + 1;
    }
    return std::nullopt;
  };
  const auto read = counter("rchar"), written = counter("wchar");
  if (!read || !written) return std::nullopt;
  return *read + *written;
}

std::optional<ProcessActivity> read_process_activity(pid_t pid) {
  const auto state = read_run_state(pid);
  if (!state) return std::nullopt;
  ProcessActivity activity;
  activity.cpu_s = state->cpu_s;
  const std::string main_thread = fmt::format("/proc/{}/task/{}/", pid, pid);
  if (const auto times = parse_schedstat(read_text(main_thread + "schedstat")))
    std::tie(activity.main_run_s, activity.main_run_delay_s) = *times;
  if (const auto bytes = parse_io_bytes(read_text(main_thread + "io")))
    activity.main_io_bytes = *bytes;
  return activity;
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
    const std::vector<std::string_view> fields = fields_after_command(stat);
    if (fields.size() < 20 || fields[0] != "R") continue;
    cpu_set_t its;
    bool shares = false;
    if (sched_getaffinity(other, sizeof its, &its) == 0) {
      cpu_set_t both;
      CPU_AND(&both, &allowed, &its);
      shares = CPU_COUNT(&both) > 0;
    }
    if (!shares) continue;
    const double alive_s = uptime_s - field_ticks(fields, 19) / ticks_per_s;
    if (alive_s < 1) continue;
    const double share =
        (field_ticks(fields, 11) + field_ticks(fields, 12)) / ticks_per_s / alive_s;
    if (share <= busiest_share) continue;
    busiest_share = share;
    const size_t open = stat.find('('), close = stat.rfind(')');
    const std::string command = stat.substr(open + 1, close - open - 1);
    busiest = fmt::format("pid {} ({}) at {:.0f}% of a CPU", other, command, 100 * share);
  }
  return busiest;
}

}  // namespace mcprun
