#include "launcher/plan/torch_version.hpp"

#include <charconv>
#include <fstream>
#include <regex>
#include <sstream>

namespace mcprun {
namespace fs = std::filesystem;
namespace {

/// "3.11" from a venv's pyvenv.cfg ("version = 3.11.2" or "version_info = 3.11.2.final.0").
std::optional<std::string> venv_python_version(const fs::path& config) {
  std::ifstream in(config);
  static const std::regex kLine(R"(^\s*version(_info)?\s*=\s*(\d+\.\d+).*)");
  std::smatch match;
  for (std::string line; std::getline(in, line);)
    if (std::regex_match(line, match, kLine)) return match[2].str();
  return std::nullopt;
}

bool venv_includes_system_packages(const fs::path& config) {
  std::ifstream in(config);
  static const std::regex kLine(R"(^\s*include-system-site-packages\s*=\s*true\s*$)",
                                std::regex::icase);
  for (std::string line; std::getline(in, line);)
    if (std::regex_match(line, kLine)) return true;
  return false;
}

/// The base interpreter's prefix and X.Y: "/usr/bin/python3.11" -> ("/usr", "3.11").
std::pair<fs::path, std::string> base_install(const fs::path& interpreter) {
  std::error_code ec;
  const fs::path real = fs::canonical(interpreter, ec);
  const fs::path resolved = ec ? interpreter : real;
  static const std::regex kName(R"(python(\d+\.\d+))");
  std::smatch match;
  const std::string name = resolved.filename().string();
  std::string version = std::regex_match(name, match, kName) ? match[1].str() : "";
  return {resolved.parent_path().parent_path(), version};
}

/// <prefix>/lib/python<X.Y>/site-packages, or every lib/python3.* one when X.Y is unknown.
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
  static const std::regex kVersionLine(R"(^__version__\s*=\s*['"]([^'"]+)['"].*)");
  std::smatch match;
  for (std::string line; std::getline(version_py, line);)
    if (std::regex_match(line, match, kVersionLine)) return parse_torch_version(match[1].str());
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
    add_site_packages(config.parent_path(), venv_python_version(config).value_or(""),
                      "site-packages", dirs);
    if (!venv_includes_system_packages(config)) return dirs;
    break;
  }
  const auto [prefix, version] = base_install(interpreter);
  if (!env.contains("PYTHONNOUSERSITE") && !version.empty())
    if (auto home = env.find("HOME"); home != env.end())
      dirs.push_back(fs::path(home->second) / ".local/lib" / ("python" + version) / "site-packages");
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
