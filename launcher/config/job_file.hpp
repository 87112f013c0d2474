// A YAML job file (mcprun --config FILE): any flag of the command line, plus env:, script: and
// args:. Its flags go through the very CLI11 options the command line uses, so every flag is
// supported by construction and means the same in both places.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/expected.hpp"

namespace mcprun {

/// What a job file holds besides its flags, and the line each of its flags was written on.
struct JobFile {
  std::string path;
  std::map<std::string, int> flag_lines;   ///< Long flag name ("nproc-per-node") -> its line.
  std::optional<std::string> script;       ///< script:, used when the command line names none.
  std::vector<std::string> script_args;    ///< args:, which go with script:.
  std::map<std::string, std::string> env;  ///< env:, added to every worker's environment.

  /// "job.yaml:3: " before a message about a flag the file set ("--nnodes 0: expected ..."),
  /// so a value that passes CLI11 but not mcprun's own checks is still found at its line.
  std::string locate(const std::string& message) const;
};

/// Reads the job file at `path` and gives `app` each flag it holds, one key at a time so that an
/// error names its key and line. A key the file sets is no longer read from its PET_* variable
/// (the file beats the environment); parse the command line again afterwards so it beats both.
/// Returns the one line to print on bad input ("job.yaml:7: unknown key 'nprocs' (did you mean
/// nproc-per-node?)").
Expected<JobFile> apply_job_file(CLI::App& app, const std::string& path);

}  // namespace mcprun
