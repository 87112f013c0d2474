// Which torch the workers' interpreter would import, read from its installed files without
// starting Python: the worker environment follows that torch's torchrun.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/sys.hpp"

namespace mcprun {

/// An installed torch's version.
struct TorchVersion {
  int major = 0;
  int minor = 0;
  std::string text;  ///< "2.13.0+cpu", as installed.
};

/// "2.13.0+cpu", "1.13.0a0+gitunknown" -> {2, 13}, {1, 13}; nullopt without a major.minor.
std::optional<TorchVersion> parse_torch_version(std::string_view text);

/// The folders `interpreter` imports packages from, in Python's order: $PYTHONPATH, then a venv's
/// site-packages (and its base's, with include-system-site-packages), else the user site and the
/// prefix's site-packages and Debian's dist-packages. Only paths are computed: Python never runs.
std::vector<std::filesystem::path> python_package_dirs(const std::filesystem::path& interpreter,
                                                       const Environment& env);

/// The version of the first torch on `dirs`: its torch/version.py, else its torch-*.dist-info or
/// .egg-info name. A few stats and one small read, so a launch can afford it.
std::optional<TorchVersion> installed_torch_version(const std::vector<std::filesystem::path>& dirs);

/// The name that torch reads for NCCL's async error handling, as its own torchrun sets it:
/// TORCH_NCCL_ASYNC_ERROR_HANDLING from torch 2.2 (which deprecated the old name with a warning
/// on every rank), NCCL_ASYNC_ERROR_HANDLING before. No torch found: the current name.
std::string_view nccl_async_error_handling_variable(const std::optional<TorchVersion>& torch);

}  // namespace mcprun
