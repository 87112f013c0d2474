// mcprun's launch flags, torchrun's among them, in the order --help lists them: each defined once,
// with its underscore spelling and its PET_ variable, as torchrun's argparse has them.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "launcher/config/launch_config.hpp"

namespace mcprun {

/// What the flags hold as text (or in a form LaunchConfig has no field for) until they are checked.
struct FlagTexts {
  std::string nproc = "1", redirects = "0", tee = "0", ranks_filter, bind = "none", gpus;
  std::string labels;
  std::optional<double> shutdown_timeout;
  std::string signals = kDefaultSignalsToHandle;
  std::string numa;
  std::string event_log_handler = "null";
  std::string logs_specs;
  std::string stdout_filters, stderr_filters;
  std::string job_file_path;
  std::string collective_timeout = "180";
  std::string straggler_window = "60";
  std::string preflight = "off";
  bool no_stack_dumps = false;
};

/// PET_NPROC_PER_NODE for "nproc-per-node": the variable torchrun reads for a flag.
std::string env_name_for(const std::string& dashed);

/// Every launch flag on `app`, with mcprun's usage, exit codes and examples around them; each
/// writes to `config` or, where it is checked later, to `texts`.
void define_launch_flags(CLI::App& app, LaunchConfig& config, FlagTexts& texts);

}  // namespace mcprun
