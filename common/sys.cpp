#include "common/sys.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iterator>

extern char** environ;

namespace mcprun {

Environment current_environment() {
  Environment env;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string_view text(*entry);
    auto eq = text.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
  }
  return env;
}

std::filesystem::path self_executable() {
  std::error_code ec;
  auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : path;
}

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "localhost";
}

Expected<void> make_folders(const std::filesystem::path& folder) {
  std::filesystem::path made;
  for (const auto& part : folder.lexically_normal()) {
    made /= part;
    if (part.empty() || ::mkdir(made.c_str(), 0777) == 0 || errno == EEXIST) continue;
    return Error{"cannot create " + made.string() + ": " + std::strerror(errno)};
  }
  return {};
}

std::string search_path_of(const Environment& env) {
  auto path = env.find("PATH");
  return path == env.end() ? "/usr/local/bin:/usr/bin:/bin" : path->second;
}

std::optional<std::string> find_executable(std::string_view name, std::string_view search_path) {
  auto executable = [](const std::filesystem::path& candidate) {
    std::error_code ec;
    return std::filesystem::is_regular_file(candidate, ec) &&
           ::access(candidate.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string_view::npos)
    return std::string(name);  // exec reports what is wrong.
  while (!search_path.empty()) {
    const size_t colon = search_path.find(':');
    const std::string_view dir = search_path.substr(0, colon);
    search_path = colon == std::string_view::npos ? "" : search_path.substr(colon + 1);
    if (dir.empty()) continue;
    const std::filesystem::path candidate = std::filesystem::path(dir) / name;
    if (executable(candidate)) return candidate.string();
  }
  return std::nullopt;
}

std::string signal_name(int signal) {
  const char* abbrev = ::sigabbrev_np(signal);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signal);
}

std::string describe_exit(int exit_code, int signal) {
  if (signal != 0) return signal_name(signal) + " (signal " + std::to_string(signal) + ")";
  return "exit code " + std::to_string(exit_code);
}

std::string human_duration(double seconds) {
  return seconds < 1 ? fmt::format("{:.0f} ms", seconds * 1000) : fmt::format("{:.1f} s", seconds);
}

std::string human_bytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  size_t unit = 0;
  while (unit + 1 < std::size(kUnits) && bytes >= 1024) {
    bytes /= 1024;
    ++unit;
  }
  // Whole numbers print bare ("64 MiB"), others with one decimal ("1.5 GiB").
  return bytes == std::floor(bytes) ? fmt::format("{:.0f} {}", bytes, kUnits[unit])
                                    : fmt::format("{:.1f} {}", bytes, kUnits[unit]);
}

std::string utc_timestamp(std::chrono::system_clock::time_point time) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  std::tm utc{};
  ::gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace mcprun
