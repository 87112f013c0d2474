#include "launcher/run_directory.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/logging.hpp"
#include "common/sys.hpp"

namespace mcprun {

bool keeps_log_files(const LaunchConfig& config) {
  const bool streams_to_files = config.redirects.all || config.tee.all ||
                                !config.redirects.per_rank.empty() || !config.tee.per_rank.empty();
  return !config.log_dir.empty() || streams_to_files || config.nccl_debug;
}

Expected<std::unique_ptr<RunDirectory>> RunDirectory::create(const LaunchConfig& config) {
  std::filesystem::path parent = config.log_dir;
  if (parent.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    parent = tmp && *tmp ? tmp : "/tmp";
  }
  // A --log-dir is the user's input, named as such; TMPDIR's folder is mcprun's own choice.
  const std::string named = config.log_dir.empty() ? "" : "--log-dir " + config.log_dir + ": ";
  if (auto made = make_folders(parent); !made) return Error{named + made.error().message};
  std::string pattern = (parent / ("mcprun_" + config.rdzv_id + "_XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr)
    return Error{named + "cannot create a run folder in " + parent.string() + ": " +
                 std::strerror(errno)};
  const bool keep = keeps_log_files(config);
  if (keep) spdlog::info("logs of this run: {}", pattern);
  return std::unique_ptr<RunDirectory>(new RunDirectory(pattern, keep));
}

RunDirectory::~RunDirectory() {
  std::error_code ec;
  if (!runtime_.empty()) std::filesystem::remove_all(runtime_, ec);
  if (!keep_) std::filesystem::remove_all(path_, ec);
}

AttemptFiles RunDirectory::attempt(int restart_count) const {
  return {path_ / ("attempt_" + std::to_string(restart_count)), keep_};
}

void RunDirectory::keep() {
  if (!keep_) spdlog::info("keeping this run's files: {}", path_.string());
  keep_ = true;
}

std::filesystem::path RunDirectory::runtime_dir() {
  if ((path_ / "agent.sock").string().size() < kUnixPathLimit) return path_;
  if (runtime_.empty()) {
    std::string pattern = "/tmp/mcprun_rt_XXXXXX";
    if (::mkdtemp(pattern.data()) != nullptr) runtime_ = pattern;
  }
  return runtime_;
}

}  // namespace mcprun
