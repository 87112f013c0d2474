// The process's view of its host: environment, host name, executable lookup, signal names, time.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "common/expected.hpp"

namespace mcprun {

using Environment = std::map<std::string, std::string>;

/// The environment mcprun itself was started with.
Environment current_environment();

/// This host's name (gethostname), "localhost" if it has none.
std::string host_name();

/// PATH from `env`, or the shell's default when it is unset.
std::string search_path_of(const Environment& env);

/// Looks `name` up on a ':'-separated `search_path` as execvp would, except that empty entries
/// (the current directory) are skipped, so a job's working directory cannot plant a "python3" or
/// a "gdb". A name with a slash is returned unchanged.
std::optional<std::string> find_executable(std::string_view name, std::string_view search_path);

/// This program's own file (/proc/self/exe); empty when it cannot be read.
std::filesystem::path self_executable();

/// Creates `folder` and each missing parent, as `mkdir -p` does. The error names the one folder
/// that could not be made and why: "cannot create /srv/shared/logs: Permission denied" (where
/// std::filesystem would name only the last one, and a later open() would say "No such file").
Expected<void> make_folders(const std::filesystem::path& folder);

/// "SIGKILL" for 9, "signal 77" for an unnamed number.
std::string signal_name(int signal);

/// "exit code 3", or "SIGKILL (signal 9)" for a process a signal ended.
std::string describe_exit(int exit_code, int signal);

/// "42 ms" under a second, "1.5 s" from one: how the lines a person reads give a duration.
std::string human_duration(double seconds);
/// "64 MiB", "1.5 GiB": the largest binary unit that fits, one decimal unless a whole number.
std::string human_bytes(double bytes);

/// "2026-12-03T13:53:17Z": error files, reports and stack dumps all stamp time this way.
std::string utc_timestamp(
    std::chrono::system_clock::time_point time = std::chrono::system_clock::now());

}  // namespace mcprun
