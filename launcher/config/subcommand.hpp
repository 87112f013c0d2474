// The one way a subcommand (`mcprun doctor`, `store`, `jobs`, `status`, `stop`) reads its flags.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "common/exit_status.hpp"

namespace mcprun {

/// Parses `args` (the words after the subcommand) into `app`. Returns the exit code when the
/// command is already over: 0 after --help, 2 with one line for bad flags; nullopt to run it.
inline std::optional<int> parse_subcommand(CLI::App& app, const std::vector<std::string>& args) {
  try {
    app.parse(std::vector<std::string>(args.rbegin(), args.rend()));  // CLI11 wants them reversed.
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return kExitSuccess;
  } catch (const CLI::ParseError& error) {
    return usage_error(std::string(error.what()) + " (see " + app.get_name() + " --help)");
  }
  return std::nullopt;
}

}  // namespace mcprun
