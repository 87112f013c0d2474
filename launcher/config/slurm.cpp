#include "launcher/config/slurm.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <memory>
#include <sstream>

#include "common/endpoint.hpp"
#include "common/sys.hpp"
#include "launcher/process/deadline.hpp"

namespace mcprun {
namespace {

std::optional<long> parse_number(std::string_view text) {
  long value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < 0)
    return std::nullopt;
  return value;
}

/// "01-04,07" -> {"01","02","03","04","07"}: each range's width is its low bound's, as in
/// Slurm's hostlist.c (n[9-11] is n9 n10 n11, x[001-3] is x001 x002 x003).
std::optional<std::vector<std::string>> expand_ranges(std::string_view ranges) {
  std::vector<std::string> numbers;
  std::stringstream in{std::string(ranges)};
  for (std::string item; std::getline(in, item, ',');) {
    const auto dash = item.find('-');
    const std::string lo_text = item.substr(0, dash);
    auto lo = parse_number(lo_text);
    auto hi =
        dash == std::string::npos ? lo : parse_number(std::string_view(item).substr(dash + 1));
    if (!lo || !hi || *hi < *lo || *hi - *lo > 100000) return std::nullopt;
    for (long n = *lo; n <= *hi; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < lo_text.size()) digits.insert(0, lo_text.size() - digits.size(), '0');
      numbers.push_back(std::move(digits));
    }
  }
  if (numbers.empty()) return std::nullopt;
  return numbers;
}

/// One name with any number of bracket groups, multiplied out left to right.
std::optional<std::vector<std::string>> expand_name(std::string_view name) {
  std::vector<std::string> names{""};
  while (!name.empty()) {
    const auto open = name.find('[');
    if (open == std::string_view::npos) {
      // Slurm accepts text after a bracket only when another bracket follows (a[1-2]-b[3-4]).
      if (names.size() > 1 || name.find(']') != std::string_view::npos) return std::nullopt;
      for (auto& prefix : names) prefix += name;
      break;
    }
    const auto close = name.find(']', open);
    if (close == std::string_view::npos) return std::nullopt;
    auto numbers = expand_ranges(name.substr(open + 1, close - open - 1));
    if (!numbers) return std::nullopt;
    std::vector<std::string> next;
    for (const auto& prefix : names)
      for (const auto& number : *numbers)
        next.push_back(prefix + std::string(name.substr(0, open)) + number);
    names = std::move(next);
    name.remove_prefix(close + 1);
  }
  return names;
}

std::optional<std::string> lookup(const Environment& env, const char* name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

/// The first of the named variables that is set.
std::optional<std::string> first_of(const Environment& env,
                                    std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (auto value = lookup(env, name)) return value;
  return std::nullopt;
}

/// Whether `host` is safe to put on scontrol's command line (a Slurm node name).
bool plain_host_name(const std::string& host) {
  return !host.empty() && host.size() < 256 && std::all_of(host.begin(), host.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

std::optional<std::string> getaddrinfo_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || !found) return std::nullopt;
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owner(found, ::freeaddrinfo);
  // IPv4 first: it is what a cluster's other nodes most surely route to.
  for (int family : {AF_INET, AF_INET6})
    for (addrinfo* entry = found; entry; entry = entry->ai_next) {
      if (entry->ai_family != family) continue;
      char text[INET6_ADDRSTRLEN] = {};
      const void* address =
          family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(entry->ai_addr)->sin_addr)
              : static_cast<const void*>(
                    &reinterpret_cast<sockaddr_in6*>(entry->ai_addr)->sin6_addr);
      if (::inet_ntop(family, address, text, sizeof text)) return std::string(text);
    }
  return std::nullopt;
}

Error not_a_hostlist(std::string_view text) {
  return Error{"hostlist " + std::string(text) +
               ": not a Slurm hostlist expression (like n[1-4],gpu-[01-02])"};
}

}  // namespace

Expected<std::vector<std::string>> expand_hostlist(std::string_view text) {
  std::vector<std::string> hosts;
  size_t depth = 0, start = 0;
  auto take = [&](size_t end) -> bool {
    std::string_view name = text.substr(start, end - start);
    start = end + 1;
    if (name.empty()) return true;
    auto names = expand_name(name);
    if (!names) return false;
    hosts.insert(hosts.end(), names->begin(), names->end());
    return true;
  };
  for (size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : ',';
    if (c == '[')
      ++depth;
    else if (c == ']' && depth > 0)
      --depth;
    else if ((c == ',' || c == ' ' || c == '\n') && depth == 0 && !take(i))
      return not_a_hostlist(text);
  }
  if (depth != 0 || hosts.empty()) return not_a_hostlist(text);
  return hosts;
}

std::optional<std::vector<int>> expand_tasks_per_node(std::string_view text) {
  std::vector<int> counts;
  std::stringstream in{std::string(text)};
  for (std::string item; std::getline(in, item, ',');) {
    long repeat = 1;
    const auto paren = item.find("(x");
    if (paren != std::string::npos) {
      if (item.back() != ')') return std::nullopt;
      auto times = parse_number(std::string_view(item).substr(paren + 2, item.size() - paren - 3));
      if (!times || *times < 1 || *times > 1000000) return std::nullopt;
      repeat = *times;
    }
    auto count = parse_number(std::string_view(item).substr(0, paren));
    if (!count) return std::nullopt;
    counts.insert(counts.end(), static_cast<size_t>(repeat), static_cast<int>(*count));
  }
  if (counts.empty()) return std::nullopt;
  return counts;
}

int SlurmStep::master_port() const {
  // The job id's trailing digits (an array task's id is a plain number too).
  long id = 0;
  for (char c : job_id)
    if (c >= '0' && c <= '9') id = (id * 10 + (c - '0')) % kSlurmPortSpan;
  return kSlurmPortBase + static_cast<int>(id);
}

Expected<std::optional<SlurmStep>> detect_slurm_step(const Environment& env) {
  const std::optional<SlurmStep> not_under_slurm;
  if (lookup(env, "MCPRUN_SLURM") == "0") return not_under_slurm;
  auto job_id = lookup(env, "SLURM_JOB_ID");
  auto step_id = first_of(env, {"SLURM_STEP_ID", "SLURM_STEPID"});
  if (!job_id || !step_id) return not_under_slurm;
  SlurmStep step;
  step.job_id = *job_id;
  step.step_id = *step_id;

  auto number = [&](std::initializer_list<const char*> names, int fallback) -> Expected<int> {
    for (const char* name : names) {
      auto value = lookup(env, name);
      if (!value) continue;
      auto parsed = parse_number(*value);
      if (!parsed || *parsed > 1000000)
        return Error{std::string(name) + "=" + *value +
                     ": expected a number (is this a Slurm step?)"};
      return static_cast<int>(*parsed);
    }
    return fallback;
  };
  auto nnodes = number({"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}, 1);
  if (!nnodes) return nnodes.error();
  step.nnodes = *nnodes;
  auto node_id = number({"SLURM_NODEID"}, 0);
  if (!node_id) return node_id.error();
  step.node_id = *node_id;
  if (step.nnodes < 1 || step.node_id >= step.nnodes)
    return Error{"SLURM_NODEID=" + std::to_string(step.node_id) + " is not below the step's " +
                 std::to_string(step.nnodes) + " node(s)"};

  if (auto nodelist =
          first_of(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})) {
    auto hosts = expand_hostlist(*nodelist);
    if (!hosts) return hosts.error();
    step.hosts = std::move(*hosts);
  }

  // The task count: the step's own variables, else the job's. srun -n 8 gives 8(x1) or NTASKS 8.
  const auto tasks_text = first_of(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
  if (tasks_text) {
    auto counts = expand_tasks_per_node(*tasks_text);
    if (!counts)
      return Error{"SLURM_TASKS_PER_NODE=" + *tasks_text + ": expected counts like 1(x2)"};
    step.max_tasks_per_node = *std::max_element(counts->begin(), counts->end());
  } else if (auto per_node = lookup(env, "SLURM_NTASKS_PER_NODE");
             per_node && parse_number(*per_node)) {
    step.max_tasks_per_node = static_cast<int>(*parse_number(*per_node));
  }
  auto ntasks = number({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}, step.nnodes);
  if (!ntasks) return ntasks.error();
  if (*ntasks > step.nnodes) step.max_tasks_per_node = std::max(step.max_tasks_per_node, 2);

  // What Slurm granted: the gres CUDA_VISIBLE_DEVICES it set (renumbered inside a device cgroup),
  // else the step's GPU indices, else the job's.
  step.gpus = first_of(env, {"CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"});
  return std::optional<SlurmStep>(std::move(step));
}

std::optional<std::string> resolve_slurm_host(const std::string& host) {
  if (auto address = getaddrinfo_address(host)) return address;
  if (!plain_host_name(host)) return std::nullopt;
  // A node name DNS does not know: Slurm's own NodeAddr for it, through the one bounded way
  // mcprun runs a child (no shell), so a wedged slurmctld costs kScontrolTimeout at most.
  const Environment env = current_environment();
  const auto scontrol = find_executable("scontrol", search_path_of(env));
  if (!scontrol) return std::nullopt;
  std::vector<std::string> env_lines;
  for (const auto& [key, value] : env) env_lines.push_back(key + "=" + value);
  PosixProcessControl control;
  auto run = run_with_deadline(control, {*scontrol, "-o", "show", "node", host},
                               std::move(env_lines), kScontrolTimeout, kKilledExitTimeout);
  if (!run || run->timed_out) return std::nullopt;
  const std::string& output = run->output;
  const auto at = output.find("NodeAddr=");
  if (at == std::string::npos) return std::nullopt;
  const auto begin = at + 9;
  const std::string node_addr = output.substr(begin, output.find_first_of(" \n", begin) - begin);
  if (node_addr.empty() || node_addr == host) return std::nullopt;
  return getaddrinfo_address(node_addr);
}

double slurm_kill_wait(const Environment& env) {
  auto seconds = [](const std::string& text) -> std::optional<double> {
    auto value = parse_number(text);
    if (!value) return std::nullopt;
    return static_cast<double>(*value);
  };
  if (auto exported = lookup(env, "SLURM_KILL_WAIT"))
    if (auto value = seconds(*exported)) return *value;
  std::ifstream conf(lookup(env, "SLURM_CONF").value_or("/etc/slurm/slurm.conf"));
  for (std::string line; std::getline(conf, line);) {
    line.erase(
        std::remove_if(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t'; }),
        line.end());
    std::string lower = line;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower.rfind("killwait=", 0) == 0)
      if (auto value = seconds(line.substr(9))) return *value;
  }
  return kSlurmDefaultKillWait;
}

Expected<void> apply_slurm(
    LaunchConfig& config, const Environment& env, const ExplicitFlag& set_by_user,
    const std::function<std::optional<std::string>(const std::string&)>& resolve) {
  if (config.no_slurm || config.standalone) return {};  // --standalone: one node, its own store.
  auto detected = detect_slurm_step(env);
  if (!detected) return detected.error();
  if (!*detected) return {};
  const SlurmStep* step = &**detected;
  if (step->max_tasks_per_node > 1)
    return Error{"Slurm started " + std::to_string(step->max_tasks_per_node) +
                 " tasks of mcprun on one node, and each would start every worker: run one per "
                 "node, srun --ntasks-per-node=1 mcprun ... (or --no-slurm)"};
  config.under_slurm = true;

  std::vector<std::string> taken;
  if (!set_by_user("nnodes")) {
    config.nnodes = std::to_string(step->nnodes);
    taken.push_back("nnodes " + config.nnodes);
  }
  if (!set_by_user("node-rank")) {
    config.node_rank = step->node_id;
    taken.push_back("node rank " + std::to_string(step->node_id));
  }
  if (!set_by_user("rdzv-id")) {
    config.rdzv_id = step->run_id();
    taken.push_back("run id " + config.rdzv_id);
  }
  const bool rendezvous = config.rdzv_backend == "c10d";
  const bool needs_master = rendezvous
                                ? !set_by_user("rdzv-endpoint")
                                : !set_by_user("master-addr") && !set_by_user("rdzv-endpoint");
  if (needs_master && !step->hosts.empty()) {
    const std::string& first = step->hosts.front();
    auto address = resolve(first);
    if (!address)
      return Error{"Slurm's first node " + first +
                   " resolves to no address (getaddrinfo, "
                   "scontrol show node): give --master-addr (or --rdzv-endpoint) yourself"};
    if (rendezvous) {
      config.rdzv_endpoint = Endpoint{*address, step->master_port(), ""}.text();
      if (!config.is_host) config.is_host = step->node_id == 0;
      taken.push_back("rendezvous " + config.rdzv_endpoint + " (" + first + ", hosted by node 0)");
    } else {
      config.master_addr = *address;
      taken.push_back("master " + *address + " (" + first + ")");
    }
  }
  if (!rendezvous && !set_by_user("master-port") && !set_by_user("rdzv-endpoint")) {
    config.master_port = step->master_port();
    taken.push_back("master port " + std::to_string(step->master_port()));
  }
  if (step->gpus && !set_by_user("gpus") && !env.contains("CUDA_VISIBLE_DEVICES")) {
    config.gpus = step->gpus;  // An inherited CUDA_VISIBLE_DEVICES is the allowed set already.
    taken.push_back("GPUs " + *step->gpus);
  } else if (step->gpus && !set_by_user("gpus")) {
    taken.push_back("GPUs " + *step->gpus);
  }
  if (!set_by_user("term-timeout") && !set_by_user("shutdown-timeout") &&
      !env.contains("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")) {
    const double kill_wait = slurm_kill_wait(env);
    const double within = std::max(1.0, kill_wait - kSlurmKillWaitMargin);
    if (config.term_timeout > within) {
      config.term_timeout = within;
      std::ostringstream seconds;
      seconds << within;
      taken.push_back("SIGTERM grace " + seconds.str() + " s (KillWait " +
                      std::to_string(static_cast<int>(kill_wait)) + " s)");
    }
  }
  std::string line = "Slurm job " + step->job_id + " step " + step->step_id + ", node " +
                     std::to_string(step->node_id) + " of " + std::to_string(step->nnodes);
  if (!taken.empty()) {
    line += ": took ";
    for (size_t i = 0; i < taken.size(); ++i) line += (i ? ", " : "") + taken[i];
  } else {
    line += ": every setting was given explicitly";
  }
  config.notes.push_back(line + " (--no-slurm ignores Slurm)");
  return {};
}

}  // namespace mcprun
