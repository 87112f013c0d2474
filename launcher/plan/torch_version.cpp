#include "launcher/plan/torch_version.hpp"

#include <charconv>
#include <fstream>
#include <sstream>
#include <utility>

namespace mcprun {
namespace fs = std::filesystem;
namespace {

// Plain string parsing, no std::regex: compiling a few patterns would cost each launch ~0.5 ms.

std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t\r") - first + 1);
}

/// "version = 3.11.2" -> ("version", "3.11.2"); nullopt for a line without '='.
std::optional<std::pair<std::string_view, std::string_view>> key_value(std::string_view line) {
  const auto equals = line.find('=');
  if (equals == std::string_view::npos) return std::nullopt;
  return std::pair{trim(line.substr(0, equals)), trim(line.substr(equals + 1))};
}

/// "3.11" from "3.11.2" or "3.11"; "" unless it starts with major.minor.
std::string major_minor(std::string_view text) {
  auto version = parse_torch_version(text);
  return version ? std::to_string(version->major) + "." + std::to_string(version->minor) : "";
}

/// A venv's pyvenv.cfg: its Python's X.Y ("version = 3.11.2", or "version_info = 3.11.2.final.0"
/// from virtualenv) and whether it sees the base's packages (include-system-site-packages).
struct VenvConfig {
  std::string version;
  bool system_packages = false;
};

VenvConfig read_venv_config(const fs::path& config) {
  VenvConfig venv;
  std::ifstream in(config);
  for (std::string line; std::getline(in, line);) {
    auto entry = key_value(line);
    if (!entry) continue;
    if (entry->first == "version" || entry->first == "version_info")
      venv.version = major_minor(entry->second);
    if (entry->first == "include-system-site-packages")
      venv.system_packages = entry->second == "true" || entry->second == "True";
  }
  return venv;
}

/// The base interpreter's prefix and X.Y: "/usr/bin/python3.11" -> ("/usr", "3.11").
std::pair<fs::path, std::string> base_install(const fs::path& interpreter) {
  std::error_code ec;
  const fs::path real = fs::canonical(interpreter, ec);
  const fs::path resolved = ec ? interpreter : real;
  const std::string name = resolved.filename().string();
  std::string version =
      name.starts_with("python") ? major_minor(std::string_view(name).substr(6)) : "";
  if (!version.empty() && "python" + version != name) version.clear();  // "python3.11-config".
  return {resolved.parent_path().parent_path(), version};
}

/// <prefix>/lib/python<X.Y>/<leaf>, or every lib/python3.* one when X.Y is unknown.
void add_site_packages(const fs::path& prefix, const std::string& version, const char* leaf,
                       std::vector<fs::path>& dirs) {
  if (!version.empty()) {
    dirs.push_back(prefix / "lib" / ("python" + version) / leaf);
    return;
  }
  std::error_code ec;
  for (fs::directory_iterator it(prefix / "lib", ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().starts_with("python3.")) dirs.push_back(it->path() / leaf);
}

std::optional<TorchVersion> version_in(const fs::path& dir) {
  std::ifstream version_py(dir / "torch" / "version.py");
  for (std::string line; std::getline(version_py, line);) {
    auto entry = key_value(line);  // __version__ = '2.13.0+cpu'
    if (!entry || entry->first != "__version__" || entry->second.size() < 2) continue;
    return parse_torch_version(entry->second.substr(1, entry->second.find_first_of("'\"", 1) - 1));
  }
  std::error_code ec;
  if (!fs::is_directory(dir / "torch", ec)) return std::nullopt;
  // A torch without version.py (a source checkout): its metadata folder names the version.
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with("torch-") && (name.ends_with(".dist-info") || name.ends_with(".egg-info")))
      return parse_torch_version(std::string_view(name).substr(6));
  }
  return std::nullopt;
}

}  // namespace

std::optional<TorchVersion> parse_torch_version(std::string_view text) {
  TorchVersion version;
  const char* end = text.data() + text.size();
  auto [after_major, major_error] = std::from_chars(text.data(), end, version.major);
  if (major_error != std::errc() || after_major == end || *after_major != '.') return std::nullopt;
  auto [after_minor, minor_error] = std::from_chars(after_major + 1, end, version.minor);
  if (minor_error != std::errc()) return std::nullopt;
  // A metadata folder's name: "1.13.0a0+gitunknown.egg-info" or "2.13.0+cpu-py3.11.egg-info".
  std::string_view full = text;
  for (std::string_view suffix : {".dist-info", ".egg-info"})
    if (full.ends_with(suffix)) full.remove_suffix(suffix.size());
  if (auto py = full.find("-py"); py != std::string_view::npos) full = full.substr(0, py);
  version.text = std::string(full);
  return version;
}

std::vector<fs::path> python_package_dirs(const fs::path& interpreter, const Environment& env) {
  std::vector<fs::path> dirs;
  if (auto path = env.find("PYTHONPATH"); path != env.end()) {
    std::istringstream entries(path->second);
    for (std::string entry; std::getline(entries, entry, ':');)
      if (!entry.empty()) dirs.emplace_back(entry);
  }
  // A venv is told by pyvenv.cfg beside or above the unresolved interpreter, as Python finds it.
  const fs::path bin = interpreter.parent_path();
  std::error_code ec;
  for (const fs::path& config : {bin / "pyvenv.cfg", bin.parent_path() / "pyvenv.cfg"}) {
    if (!fs::is_regular_file(config, ec)) continue;
    const VenvConfig venv = read_venv_config(config);
    add_site_packages(config.parent_path(), venv.version, "site-packages", dirs);
    if (!venv.system_packages) return dirs;
    break;
  }
  const auto [prefix, version] = base_install(interpreter);
  if (!env.contains("PYTHONNOUSERSITE") && !version.empty())
    if (auto home = env.find("HOME"); home != env.end())
      dirs.push_back(fs::path(home->second) / ".local/lib" / ("python" + version) /
                     "site-packages");
  add_site_packages(prefix, version, "site-packages", dirs);
  // Debian's layout: /usr/local/lib/python3.11/dist-packages, then /usr/lib/python3/dist-packages.
  add_site_packages(prefix / "local", version, "dist-packages", dirs);
  dirs.push_back(prefix / "lib" / "python3" / "dist-packages");
  add_site_packages(prefix, version, "dist-packages", dirs);
  return dirs;
}

std::optional<TorchVersion> installed_torch_version(const std::vector<fs::path>& dirs) {
  for (const fs::path& dir : dirs)
    if (auto version = version_in(dir)) return version;
  return std::nullopt;
}

std::string_view nccl_async_error_handling_variable(const std::optional<TorchVersion>& torch) {
  if (torch && (torch->major < 2 || (torch->major == 2 && torch->minor < 2)))
    return "NCCL_ASYNC_ERROR_HANDLING";
  return "TORCH_NCCL_ASYNC_ERROR_HANDLING";
}

}  // namespace mcprun
