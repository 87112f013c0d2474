#include "common/version.hpp"

namespace mcprun {

const std::string& mcprun_version() {
  // MCPRUN_VERSION is set on this file alone (common/CMakeLists.txt): a new version rebuilds it
  // only.
  static const std::string version = MCPRUN_VERSION;
  return version;
}

}  // namespace mcprun
