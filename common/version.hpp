// mcprun's version: CMake's project(mcprun VERSION ...) is its only source.
#pragma once

#include <string>

namespace mcprun {

/// "0.1.0", as --version, the JSON reports and the Debian package state it.
const std::string& mcprun_version();

}  // namespace mcprun
