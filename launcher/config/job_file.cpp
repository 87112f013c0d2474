#include "launcher/config/job_file.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <set>

namespace mcprun {
namespace {

/// Flags whose value is a comma list, so a YAML list writes it; the character joins a YAML map's
/// key and value (rdzv-conf: {join_timeout: 60} is join_timeout=60), 0 where a map makes no sense.
const std::map<std::string, char, std::less<>> kListFlags{
    {"gpus", 0},  {"local-ranks-filter", 0}, {"redirects", ':'},
    {"tee", ':'}, {"rdzv-conf", '='},        {"topology-labels", '='}};

/// Flags that mean nothing inside a job file.
const std::set<std::string, std::less<>> kCommandLineOnly{"config", "help", "version"};

/// The keys a job file has besides the flags.
const std::set<std::string, std::less<>> kFileKeys{"script", "args", "env"};

std::string describe(const YAML::Node& node) {
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  if (node.IsNull()) return "nothing";
  return "'" + node.Scalar() + "'";
}

/// What a flag's value must look like, from CLI11's type name ("INT:NONNEGATIVE", "FLOAT",
/// "TEXT:{spawn,fork,forkserver}").
std::string expected(const CLI::Option& option, const std::string& name) {
  if (option.get_expected_min() == 0) return "true or false";
  const std::string type = option.get_type_name();
  if (auto brace = type.find('{'); brace != std::string::npos) {
    std::string choices;
    for (char c : type.substr(brace + 1, type.rfind('}') - brace - 1))
      choices += c == ',' ? std::string(", ") : std::string(1, c);
    return "one of " + choices;
  }
  std::string what = type.rfind("INT", 0) == 0     ? "a whole number"
                     : type.rfind("FLOAT", 0) == 0 ? "a number"
                                                   : "a string";
  if (type.find("NONNEGATIVE") != std::string::npos) what += " >= 0";
  if (auto list = kListFlags.find(name); list != kListFlags.end())
    what += list->second ? ", a list or a map" : " or a list";
  return what;
}

/// The flag's value as the command line would spell it; nullopt when the YAML has the wrong shape.
std::optional<std::string> command_line_value(const CLI::Option& option, const std::string& name,
                                              const YAML::Node& value) {
  if (option.get_expected_min() == 0) {
    bool on = false;
    if (!value.IsScalar()) return std::nullopt;
    // A flag that also takes a value (preflight: fail): as the command line spells it.
    if (!YAML::convert<bool>::decode(value, on)) return value.Scalar();
    return on ? "true" : "false";
  }
  if (value.IsScalar()) return value.Scalar();
  auto list = kListFlags.find(name);
  if (list == kListFlags.end() || (value.IsMap() && list->second == 0)) return std::nullopt;
  std::string text;
  for (const auto& item : value) {
    const YAML::Node& first = value.IsMap() ? item.first : item;
    if (!first.IsScalar() || (value.IsMap() && !item.second.IsScalar())) return std::nullopt;
    text += (text.empty() ? "" : ",") + first.Scalar() +
            (value.IsMap() ? list->second + item.second.Scalar() : "");
  }
  return text;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

/// " (did you mean nproc-per-node?)": the nearest key, measured against each name and against its
/// beginning, so that a short key like "nprocs" finds "nproc-per-node" rather than "nnodes".
std::string suggestion(const CLI::App& app, const std::string& key) {
  std::vector<std::string> names(kFileKeys.begin(), kFileKeys.end());
  for (const CLI::Option* option : app.get_options())
    if (!option->get_lnames().empty() && !kCommandLineOnly.contains(option->get_lnames().front()))
      names.push_back(option->get_lnames().front());
  std::string best;
  std::pair<size_t, size_t> best_score{std::numeric_limits<size_t>::max(), 0};
  for (const std::string& name : names) {
    const size_t whole = edit_distance(key, name);
    const std::pair<size_t, size_t> score{
        std::min(whole, edit_distance(key, name.substr(0, key.size()))), whole};
    if (score < best_score) {
      best_score = score;
      best = name;
    }
  }
  if (best.empty() || best_score.first > std::max<size_t>(1, key.size() / 3)) return "";
  return " (did you mean " + best + "?)";
}

/// Reads one top-level key into `job` (script, args, env) or into `app` (a flag).
Expected<void> read_key(CLI::App& app, const std::string& path, const YAML::Node& key_node,
                        const YAML::Node& value, JobFile& job, std::map<std::string, int>& seen) {
  const int line = key_node.Mark().line + 1;
  const std::string where = path + ":" + std::to_string(line) + ": ";
  if (!key_node.IsScalar()) return Error{where + "expected a flag name, got " + describe(key_node)};
  const std::string key = key_node.Scalar();
  std::string name = key;
  std::replace(name.begin(), name.end(), '_', '-');
  CLI::Option* option = nullptr;
  if (!kFileKeys.contains(name)) {
    if (kCommandLineOnly.contains(name))
      return Error{where + key + ": only meaningful on the command line"};
    option = app.get_option_no_throw("--" + name);
    if (option == nullptr)
      return Error{where + "unknown key '" + key + "'" + suggestion(app, name)};
    name = option->get_lnames().front();
  }
  if (auto earlier = seen.find(name); earlier != seen.end())
    return Error{where + key + ": already set on line " + std::to_string(earlier->second)};
  seen[name] = line;

  if (name == "script") {
    if (!value.IsScalar()) return Error{where + "script: expected a path, got " + describe(value)};
    job.script = value.Scalar();
  } else if (name == "args") {
    if (!value.IsNull() && !value.IsSequence())
      return Error{where + "args: expected a list of arguments, got " + describe(value)};
    for (const auto& arg : value) {
      if (!arg.IsScalar())
        return Error{where + "args: expected a list of arguments, got " + describe(arg) + " in it"};
      job.script_args.push_back(arg.Scalar());
    }
  } else if (name == "env") {
    if (!value.IsNull() && !value.IsMap())
      return Error{where + "env: expected a map of NAME: value, got " + describe(value)};
    for (const auto& variable : value) {
      const std::string at =
          path + ":" + std::to_string(variable.first.Mark().line + 1) + ": env: ";
      if (!variable.first.IsScalar() || variable.first.Scalar().empty() ||
          variable.first.Scalar().find('=') != std::string::npos)
        return Error{at + "expected a variable name, got " + describe(variable.first)};
      if (!variable.second.IsNull() && !variable.second.IsScalar())
        return Error{at + variable.first.Scalar() + ": expected a string, got " +
                     describe(variable.second)};
      job.env[variable.first.Scalar()] = variable.second.IsNull() ? "" : variable.second.Scalar();
    }
  } else if (!value.IsNull()) {  // A key left empty keeps the default.
    auto text = command_line_value(*option, name, value);
    if (!text)
      return Error{where + key + ": expected " + expected(*option, name) + ", got " +
                   describe(value)};
    try {
      app.parse(std::vector<std::string>{"--" + name + "=" + *text});
    } catch (const CLI::ParseError&) {
      return Error{where + key + ": expected " + expected(*option, name) + ", got '" + *text + "'"};
    }
    job.flag_lines[name] = line;
  }
  return {};
}

}  // namespace

std::string JobFile::locate(const std::string& message) const {
  for (const auto& [name, line] : flag_lines) {
    const std::string flag = "--" + name;
    if (message.rfind(flag, 0) == 0 && (message.size() == flag.size() ||
                                        message[flag.size()] == ' ' || message[flag.size()] == ':'))
      return path + ":" + std::to_string(line) + ": " + message;
  }
  return message;
}

Expected<JobFile> apply_job_file(CLI::App& app, const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return Error{path + ": cannot read the job file"};
  } catch (const YAML::Exception& error) {
    return Error{path + ":" + std::to_string(error.mark.line + 1) +
                 ": not valid YAML: " + error.msg};
  }
  JobFile job;
  job.path = path;
  if (root.IsNull()) return job;
  if (!root.IsMap())
    return Error{path + ": expected a map of flags (nproc-per-node: 2, ...), got " +
                 describe(root)};

  // Meanwhile PET_* variables stay out, so that an error is the file's own.
  std::vector<std::pair<CLI::Option*, std::string>> envnames;
  for (CLI::Option* option : app.get_options()) {
    envnames.emplace_back(option, option->get_envname());
    option->envname("");
  }
  std::map<std::string, int> seen;
  for (const auto& entry : root)
    if (auto read = read_key(app, path, entry.first, entry.second, job, seen); !read)
      return read.error();
  if (!job.script && seen.contains("args"))
    return Error{path + ":" + std::to_string(seen["args"]) + ": args: needs script: beside it"};
  for (auto& [option, envname] : envnames)
    if (option->get_lnames().empty() || !job.flag_lines.contains(option->get_lnames().front()))
      option->envname(envname);
  return job;
}

}  // namespace mcprun
