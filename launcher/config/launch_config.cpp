#include "launcher/config/launch_config.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <sstream>

#include "common/endpoint.hpp"
#include "common/sys.hpp"
#include "common/version.hpp"
#include "launcher/config/job_file.hpp"
#include "launcher/config/launch_flags.hpp"
#include "launcher/config/slurm.hpp"

namespace mcprun {
namespace {

std::optional<int> parse_int(std::string_view text) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<NprocSpec> parse_nproc(const std::string& text) {
  if (text == "cpu") return NprocSpec{NprocSpec::Kind::kCpu, 0};
  if (text == "gpu") return NprocSpec{NprocSpec::Kind::kGpu, 0};
  if (text == "auto") return NprocSpec{NprocSpec::Kind::kAuto, 0};
  auto count = parse_int(text);
  if (!count || *count < 1) return std::nullopt;
  return NprocSpec{NprocSpec::Kind::kCount, *count};
}

std::optional<std::set<int>> parse_rank_list(const std::string& text) {
  std::set<int> ranks;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    auto rank = parse_int(item);
    if (!rank || *rank < 0) return std::nullopt;
    ranks.insert(*rank);
  }
  if (ranks.empty()) return std::nullopt;
  return ranks;
}

/// Without the blanks and quotes around it: quotes a wrapper script meant for a shell reach
/// mcprun as they reach torchrun's argparse (--rdzv-conf='join_timeout=5,last_call_timeout=1'),
/// whole-value or per item, and no key, value or signal name holds one.
std::string unquoted(std::string_view text) {
  auto strip = [](char c) { return c == ' ' || c == '\t' || c == '\'' || c == '"'; };
  while (!text.empty() && strip(text.front())) text.remove_prefix(1);
  while (!text.empty() && strip(text.back())) text.remove_suffix(1);
  return std::string(text);
}

/// The signals --signals-to-handle may name: the four that stop the group by default, the two
/// that are only forwarded, and the other terminating ones a scheduler may send first.
constexpr std::pair<const char*, int> kHandledSignals[] = {
    {"SIGTERM", SIGTERM}, {"SIGINT", SIGINT},   {"SIGHUP", SIGHUP},       {"SIGQUIT", SIGQUIT},
    {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}, {"SIGALRM", SIGALRM},     {"SIGXCPU", SIGXCPU},
    {"SIGXFSZ", SIGXFSZ}, {"SIGPWR", SIGPWR},   {"SIGVTALRM", SIGVTALRM}, {"SIGPROF", SIGPROF}};

/// rdzv-conf keys torch 2.x reads (dynamic, c10d, etcd and static rendezvous) that mcprun has
/// no use for: accepted and named in one warning.
constexpr const char* kUnusedRdzvKeys[] = {"close_timeout",
                                           "heartbeat_timeout",
                                           "keep_alive_interval",
                                           "keep_alive_max_attempt",
                                           "read_timeout",
                                           "timeout",
                                           "store_type",
                                           "use_libuv",
                                           "rank",
                                           "protocol",
                                           "cert",
                                           "key",
                                           "cacert",
                                           "etcd_prefix",
                                           "ssl_cert",
                                           "ssl_cert_key",
                                           "ca_cert"};

/// torch's get_as_bool.
std::optional<bool> parse_bool(std::string value) {
  for (char& c : value) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* yes : {"1", "true", "t", "yes", "y"})
    if (value == yes) return true;
  for (const char* no : {"0", "false", "f", "no", "n"})
    if (value == no) return false;
  return std::nullopt;
}

/// Applies --rdzv-conf to `config`: quotes stripped, honoured keys checked, torch's other keys
/// collected in one warning.
Expected<void> apply_rdzv_conf(const std::string& text, LaunchConfig& config) {
  std::vector<std::string> unused;
  std::stringstream in(unquoted(text));
  for (std::string raw; std::getline(in, raw, ',');) {
    const std::string item = unquoted(raw);
    if (item.empty()) continue;
    const auto eq = item.find('=');
    const std::string key = unquoted(item.substr(0, eq));
    const std::string value = eq == std::string::npos ? "" : unquoted(item.substr(eq + 1));
    if (value.empty()) return Error{"--rdzv-conf " + item + ": expected key=value"};
    // torch's etcd backends call the join timeout "timeout".
    const bool join_timeout = key == "join_timeout" || (key == "timeout" && config.uses_etcd());
    if (join_timeout || key == "last_call_timeout") {
      char* end = nullptr;
      const double seconds = std::strtod(value.c_str(), &end);
      if (!end || *end != '\0' || !(seconds > 0))
        return Error{"--rdzv-conf " + item + ": expected " + key + "=SECONDS (a number > 0)"};
      (join_timeout ? config.join_timeout : config.last_call_timeout) = seconds;
    } else if (key == "protocol" && config.uses_etcd()) {
      if (value != "http" && value != "https")
        return Error{"--rdzv-conf " + item + ": expected protocol=http|https"};
      config.etcd_tls.https = value == "https";
    } else if ((key == "cacert" || key == "cert" || key == "key") && config.uses_etcd()) {
      (key == "cacert" ? config.etcd_tls.cacert
       : key == "cert" ? config.etcd_tls.cert
                       : config.etcd_tls.key) = value;
    } else if (key == "is_host") {
      config.is_host = parse_bool(value);
      if (!config.is_host)
        return Error{"--rdzv-conf " + item + ": expected is_host=true|false|1|0"};
    } else if (std::find_if(std::begin(kUnusedRdzvKeys), std::end(kUnusedRdzvKeys),
                            [&](const char* known) { return key == known; }) !=
               std::end(kUnusedRdzvKeys)) {
      unused.push_back(key);
    } else {
      return Error{"--rdzv-conf " + item +
                   ": unknown key; mcprun honours join_timeout, last_call_timeout and is_host, "
                   "with etcd also timeout, protocol, cacert, cert and key (and accepts "
                   "torchrun's other keys)"};
    }
  }
  if (!unused.empty()) {
    std::string names;
    for (const std::string& key : unused) names += (names.empty() ? "" : ", ") + key;
    config.warnings.push_back("--rdzv-conf " + names + (unused.size() > 1 ? " are" : " is") +
                              " accepted for torchrun and unused by mcprun (it honours "
                              "join_timeout, last_call_timeout and is_host)");
  }
  return {};
}

/// Whether `option` reads a value (so the next argument is its value, not the script).
bool takes_value(const CLI::Option& option) { return option.get_type_size_max() > 0; }

/// argparse's allow_abbrev for the flags before the script: an unambiguous prefix of a long flag
/// ("--nproc_per=2", "--redirect 3") becomes that flag, spelled as typed ("-" or "_"). The names
/// are CLI11's own. An ambiguous prefix is a usage error naming the candidates.
Expected<std::vector<std::string>> expand_abbreviations(const CLI::App& app,
                                                        const std::vector<std::string>& args) {
  const auto options = app.get_options();
  std::vector<std::string> expanded;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--" || arg.size() < 2 || arg[0] != '-') break;  // The script and its arguments.
    const CLI::Option* found = nullptr;
    std::string rewritten = arg;
    bool attached = false;
    if (arg[1] == '-') {
      const auto eq = arg.find('=');
      attached = eq != std::string::npos;
      const std::string name = arg.substr(2, attached ? eq - 2 : std::string::npos);
      std::vector<std::pair<const CLI::Option*, std::string>> matches;
      for (const CLI::Option* option : options) {
        for (const std::string& long_name : option->get_lnames()) {
          if (long_name == name) {
            found = option;
            break;
          }
        }
        if (found) break;
        // One match per option: both spellings of a flag are one flag. The spelling typed wins.
        std::optional<std::string> match;
        bool typed_match = false;
        for (const std::string& long_name : option->get_lnames()) {
          if (name.empty() || long_name.rfind(name, 0) != 0) continue;
          const bool typed_spelling =
              (name.find('_') == std::string::npos || long_name.find('-') == std::string::npos) &&
              (name.find('-') == std::string::npos || long_name.find('_') == std::string::npos);
          if (!match || (typed_spelling && !typed_match)) match = long_name;
          typed_match = typed_match || typed_spelling;
        }
        if (match) matches.emplace_back(option, *match);
      }
      if (!found && matches.size() > 1) {
        std::string names;
        for (const auto& match : matches) names += (names.empty() ? "--" : ", --") + match.second;
        return Error{"ambiguous option: --" + name + " could match " + names};
      }
      if (!found && matches.size() == 1) {
        found = matches.front().first;
        rewritten = "--" + matches.front().second + (attached ? arg.substr(eq) : "");
      }
    } else {
      for (const CLI::Option* option : options)
        for (const std::string& short_name : option->get_snames())
          if (short_name == arg.substr(1, 1)) found = option;
      attached = arg.size() > 2;  // "-n4"
    }
    if (!found) break;  // An unknown flag: CLI11 stops there and it is reported as unknown.
    expanded.push_back(rewritten);
    if (!attached && takes_value(*found) && i + 1 < args.size()) expanded.push_back(args[++i]);
  }
  expanded.insert(expanded.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return expanded;
}

}  // namespace

Expected<std::set<int>> parse_signal_list(const std::string& text) {
  std::set<int> signals;
  std::stringstream in(unquoted(text));
  for (std::string raw; std::getline(in, raw, ',');) {
    std::string name = unquoted(raw);
    if (name.empty()) continue;
    if (name.rfind("SIG", 0) != 0) name = "SIG" + name;
    auto known = std::find_if(std::begin(kHandledSignals), std::end(kHandledSignals),
                              [&](const auto& entry) { return name == entry.first; });
    if (known == std::end(kHandledSignals)) {
      std::string names;
      for (const auto& [signal_name, number] : kHandledSignals)
        names += (names.empty() ? "" : ", ") + std::string(signal_name);
      return Error{"--signals-to-handle " + unquoted(raw) + ": not a signal mcprun can handle; " +
                   "expected a comma-separated list of " + names};
    }
    signals.insert(known->second);
  }
  return signals;
}

std::string format_signal_list(const std::set<int>& signals) {
  std::string text;
  for (const auto& [name, number] : kHandledSignals)
    if (signals.contains(number)) text += (text.empty() ? "" : ",") + std::string(name);
  return text;
}

bool forwarded_only(int signal) { return signal == SIGUSR1 || signal == SIGUSR2; }

int StreamSpec::bits_for(int local_rank) const {
  auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? all : it->second;
}

std::optional<StreamSpec> parse_stream_spec(const std::string& text) {
  StreamSpec spec;
  if (auto bits = parse_int(text)) {
    if (*bits < 0 || *bits > 3) return std::nullopt;
    spec.all = *bits;
    return spec;
  }
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    auto colon = item.find(':');
    if (colon == std::string::npos) return std::nullopt;
    auto rank = parse_int(std::string_view(item).substr(0, colon));
    auto bits = parse_int(std::string_view(item).substr(colon + 1));
    if (!rank || !bits || *rank < 0 || *bits < 0 || *bits > 3) return std::nullopt;
    spec.per_rank[*rank] = *bits;
  }
  if (spec.per_rank.empty()) return std::nullopt;
  return spec;
}

namespace {

/// The command line, then a --config job file under it (the command line beats the file). An
/// InfoRequest or an error ends the parse; nullopt goes on.
std::optional<Expected<LaunchRequest>> parse_command_line(CLI::App& app,
                                                          const std::vector<std::string>& args,
                                                          const std::string& job_file_path,
                                                          JobFile& job) {
  auto expanded = expand_abbreviations(app, args);
  if (!expanded) return expanded.error();
  // CLI11 wants argv back to front.
  const std::vector<std::string> reversed(expanded->rbegin(), expanded->rend());
  try {
    app.parse(std::vector<std::string>(reversed));
    if (!job_file_path.empty()) {
      auto loaded = apply_job_file(app, job_file_path);
      if (!loaded) return loaded.error();
      job = std::move(*loaded);
      app.parse(std::vector<std::string>(reversed));  // The command line beats the file.
      std::erase_if(job.flag_lines,
                    [&](const auto& flag) { return app.count("--" + flag.first) > 0; });
    }
  } catch (const CLI::CallForHelp&) {
    return LaunchRequest{InfoRequest{app.help()}};
  } catch (const CLI::CallForVersion&) {
    return LaunchRequest{InfoRequest{"mcprun " + mcprun_version() + "\n"}};
  } catch (const CLI::ParseError& error) {
    return Error{error.what()};
  }
  return std::nullopt;
}

/// The script and its arguments: the command line's, else the job file's.
Expected<void> take_script(const CLI::App& app, const JobFile& job, LaunchConfig& config) {
  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
  if (rest.empty() && job.script) {  // The command line names no script: the file's, with its args.
    rest = {*job.script};
    rest.insert(rest.end(), job.script_args.begin(), job.script_args.end());
  }
  config.env = job.env;
  if (rest.empty())
    return Error{"no training script given (usage: mcprun [flags] SCRIPT [ARGS...])"};
  if (rest.front().size() > 1 && rest.front()[0] == '-')
    return Error{"unknown flag " + rest.front() + " (see mcprun --help)"};
  config.script = rest.front();
  config.script_args.assign(rest.begin() + 1, rest.end());
  return {};
}

/// --nproc-per-node, --redirects, --tee, --local-ranks-filter, --gpus and --bind, checked.
Expected<void> apply_worker_texts(const FlagTexts& texts, LaunchConfig& config) {
  auto nproc = parse_nproc(texts.nproc);
  if (texts.nproc == "xpu")
    return Error{
        "--nproc-per-node xpu: mcprun pins NVIDIA GPUs only; expected a count, cpu, gpu or auto"};
  if (!nproc)
    return Error{"--nproc-per-node " + texts.nproc + ": expected a count >= 1, cpu, gpu or auto"};
  config.nproc = *nproc;

  auto redirects = parse_stream_spec(texts.redirects);
  if (!redirects)
    return Error{"--redirects " + texts.redirects + ": expected 0-3 or LOCAL_RANK:0-3,..."};
  config.redirects = *redirects;
  auto tee = parse_stream_spec(texts.tee);
  if (!tee) return Error{"--tee " + texts.tee + ": expected 0-3 or LOCAL_RANK:0-3,..."};
  config.tee = *tee;

  if (!texts.ranks_filter.empty()) {
    config.local_ranks_filter = parse_rank_list(texts.ranks_filter);
    if (!config.local_ranks_filter)
      return Error{"--local-ranks-filter " + texts.ranks_filter +
                   ": expected local ranks like 0,3"};
  }
  if (!texts.gpus.empty()) config.gpus = texts.gpus;
  config.bind = texts.bind == "numa" ? LaunchConfig::CpuBind::kNuma : LaunchConfig::CpuBind::kNone;
  return {};
}

/// --nnodes as MIN:MAX, --node-rank within it, and the rendezvous an elastic job needs.
Expected<void> apply_node_counts(LaunchConfig& config) {
  auto colon = config.nnodes.find(':');
  auto min_nodes = parse_int(std::string_view(config.nnodes).substr(0, colon));
  auto max_nodes = colon == std::string::npos
                       ? min_nodes
                       : parse_int(std::string_view(config.nnodes).substr(colon + 1));
  if (!min_nodes || !max_nodes || *min_nodes < 1 || *max_nodes < *min_nodes)
    return Error{"--nnodes " + config.nnodes + ": expected N or MIN:MAX with 1 <= MIN <= MAX"};
  config.min_nodes = *min_nodes;
  config.max_nodes = *max_nodes;
  // --standalone is a private store on loopback that no other node can reach (torchrun's private
  // rendezvous on localhost:0 waits out its join timeout for a node that never comes).
  if (config.standalone && config.max_nodes > 1)
    return Error{
        "--standalone is a one-node job, but --nnodes " + config.nnodes + " asks for up to " +
        std::to_string(config.max_nodes) +
        " nodes: drop --standalone "
        "(and join the nodes through --rdzv-backend c10d --rdzv-endpoint HOST:PORT) or use "
        "--nnodes 1"};
  if (config.node_rank && (*config.node_rank < 0 || *config.node_rank >= config.max_nodes))
    return Error{"--node-rank " + std::to_string(*config.node_rank) + ": expected 0-" +
                 std::to_string(config.max_nodes - 1)};
  if (config.rdzv_backend == "static" && config.min_nodes != config.max_nodes)
    return Error{"--nnodes " + config.nnodes +
                 ": an elastic MIN:MAX job needs "
                 "--rdzv-backend c10d and --rdzv-endpoint"};
  if (config.uses_rendezvous() && config.rdzv_endpoint.empty())
    return Error{"--nnodes " + config.nnodes + " with --rdzv-backend " + config.rdzv_backend +
                 " needs --rdzv-endpoint HOST:PORT"};
  return {};
}

/// A c10d --rdzv-endpoint in full: torchrun's c10d backend reads a bare HOST as HOST:29400, so
/// every later reader (client, embedded host, doctor) sees one form.
Expected<void> complete_c10d_endpoint(LaunchConfig& config) {
  if (config.rdzv_backend != "c10d" || config.rdzv_endpoint.empty()) return {};
  auto endpoint = parse_endpoint(unquoted(config.rdzv_endpoint), kC10dRules);
  if (!endpoint) return Error{"--rdzv-endpoint " + endpoint.error().message};
  config.rdzv_endpoint = endpoint->text();
  return {};
}

/// --metrics-port in full: a bare PORT listens on loopback, so that metrics are opt-in twice.
Expected<void> complete_metrics_port(LaunchConfig& config) {
  if (config.metrics_port.empty() || config.metrics_port.find(':') != std::string::npos) return {};
  auto port = parse_port(config.metrics_port);
  if (!port) return Error{"--metrics-port " + port.error().message};
  config.metrics_port = "127.0.0.1:" + std::to_string(*port);
  return {};
}

/// --topology-labels key=value,...
Expected<void> apply_topology_labels(const std::string& text, LaunchConfig& config) {
  if (text.empty()) return {};
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      return Error{"--topology-labels " + text + ": expected key=value,..."};
    config.topology_labels[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return {};
}

/// Static backend: --rdzv-endpoint names the master, as torchrun's static rendezvous reads it.
bool endpoint_names_static_master(const LaunchConfig& config) {
  return config.rdzv_backend == "static" && !config.standalone && !config.rdzv_endpoint.empty();
}

/// The static master from --rdzv-endpoint, over --master-addr and --master-port (with a warning).
Expected<void> apply_static_master(const CLI::App& app, LaunchConfig& config) {
  // Port 0, as for a listener: the master reserves a free one.
  auto endpoint = parse_endpoint(unquoted(config.rdzv_endpoint), kListenRules);
  if (!endpoint)
    return Error{"--rdzv-endpoint " + endpoint.error().message + " (the static backend's master)"};
  if (app.count("--master-addr") > 0 && config.master_addr != endpoint->host)
    config.warnings.push_back("--master-addr " + config.master_addr +
                              " is ignored: --rdzv-endpoint " + config.rdzv_endpoint +
                              " names the master (as in torchrun)");
  if (config.master_port && *config.master_port != endpoint->port)
    config.warnings.push_back("--master-port " + std::to_string(*config.master_port) +
                              " is ignored: --rdzv-endpoint " + config.rdzv_endpoint +
                              " names the master (as in torchrun)");
  config.master_addr = endpoint->host;
  config.master_port = endpoint->port;
  if (*config.master_port == 0) config.master_port.reset();  // Port 0: a free one.
  return {};
}

/// MASTER_PORT's default and range, the backend, and flags that contradict each other.
Expected<void> check_master_and_backend(LaunchConfig& config) {
  // Static multi-node: every node must agree on the port, so torchrun's fixed default applies.
  if (config.max_nodes > 1 && config.rdzv_backend == "static" && !config.master_port)
    config.master_port = 29500;
  if (config.master_port && (*config.master_port < 1 || *config.master_port > 65535))
    return Error{"--master-port " + std::to_string(*config.master_port) + ": expected 1-65535"};
  if (config.rdzv_backend != "static" && config.rdzv_backend != "c10d" && !config.uses_etcd())
    return Error{"--rdzv-backend " + config.rdzv_backend +
                 ": expected static, c10d, or etcd (etcd-v2: the same, on etcd's v3 API)"};
  if (config.uses_etcd()) {
    if (auto members = etcd_members(config.rdzv_endpoint); !members) return members.error();
    const auto& tls = config.etcd_tls;
    if (tls.cert.empty() != tls.key.empty())
      return Error{"--rdzv-conf: cert and key name a client certificate together: give both"};
    if (!tls.https && (!tls.cacert.empty() || !tls.cert.empty()))
      return Error{"--rdzv-conf: cacert, cert and key are for TLS: add protocol=https"};
  }
  if (config.module && config.no_python)
    return Error{"--module and --no-python cannot be used together"};
  if (config.start_method != "spawn")
    config.warnings.push_back("--start-method " + config.start_method +
                              " is ignored: every worker is a fresh exec'ed process (spawn)");
  return {};
}

/// --signals-to-handle and --numa-binding, checked.
Expected<void> apply_signals_and_binding(const FlagTexts& texts, LaunchConfig& config) {
  auto signals = parse_signal_list(texts.signals);
  if (!signals) return signals.error();
  config.signals_to_handle = *signals;
  if (!texts.numa.empty()) {
    config.numa_binding = parse_numa_binding(texts.numa);
    if (!config.numa_binding)
      return Error{"--numa-binding " + texts.numa +
                   ": expected node, socket, exclusive or core-complex"};
  }
  return {};
}

/// torchrun's flags that mcprun accepts only at their defaults: a warning or a usage error.
Expected<void> check_accepted_torchrun_flags(const FlagTexts& texts, LaunchConfig& config) {
  if (texts.event_log_handler != "null")
    config.warnings.push_back("--event-log-handler " + texts.event_log_handler +
                              " is ignored: mcprun has no event log handlers");
  if (!texts.logs_specs.empty() && texts.logs_specs != "default")
    return Error{"--logs-specs " + texts.logs_specs +
                 ": mcprun has only torchrun's default "
                 "LogsSpecs (default); its logs are laid out by --log-dir, --redirects and --tee"};
  for (const auto* filters : {&texts.stdout_filters, &texts.stderr_filters})
    if (!unquoted(*filters).empty())
      return Error{std::string(filters == &texts.stdout_filters ? "--duplicate-stdout-filters "
                                                                : "--duplicate-stderr-filters ") +
                   *filters +
                   ": mcprun does not copy matching lines to a second file; keep "
                   "every line with --log-dir and grep its stdout.log/stderr.log"};
  return {};
}

/// --term-timeout unless given: --shutdown-timeout, else TORCH_ELASTIC_SHUTDOWN_TIMEOUT.
Expected<void> resolve_term_timeout(const CLI::App& app, const JobFile& job, const FlagTexts& texts,
                                    LaunchConfig& config) {
  if (app.count("--term-timeout") > 0 || job.flag_lines.contains("term-timeout") ||
      std::getenv("PET_TERM_TIMEOUT") != nullptr)
    return {};
  if (texts.shutdown_timeout) {
    config.term_timeout = *texts.shutdown_timeout;
  } else if (const char* torch_timeout = std::getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")) {
    char* end = nullptr;
    const double seconds = std::strtod(torch_timeout, &end);
    if (!*torch_timeout || *end != '\0' || !(seconds >= 0))
      return Error{std::string("TORCH_ELASTIC_SHUTDOWN_TIMEOUT=") + torch_timeout +
                   ": expected seconds >= 0"};
    config.term_timeout = seconds;
  }
  return {};
}

/// torchrun reads the template from its own environment (a job file's env: counts as exported).
void resolve_log_line_prefix(const JobFile& job, LaunchConfig& config) {
  const char* prefix_template = std::getenv(kLogLinePrefixTemplateVariable);
  if (auto it = job.env.find(kLogLinePrefixTemplateVariable); it != job.env.end())
    prefix_template = it->second.c_str();
  if (prefix_template && *prefix_template) config.log_line_prefix_template = prefix_template;
}

/// MASTER_ADDR: loopback when standalone, else --local-addr unless the master was named.
void resolve_master_addr(const CLI::App& app, const JobFile& job, bool static_master,
                         LaunchConfig& config) {
  if (config.standalone)
    config.master_addr = "127.0.0.1";
  else if (!static_master && !config.local_addr.empty() && app.count("--master-addr") == 0 &&
           !job.flag_lines.contains("master-addr") && std::getenv("PET_MASTER_ADDR") == nullptr)
    config.master_addr = config.local_addr;
}

/// parse_launch_config, recording in `job` what a --config job file set.
Expected<LaunchRequest> parse_arguments(const std::vector<std::string>& args, JobFile& job) {
  LaunchConfig config;
  CLI::App app;
  FlagTexts texts;
  define_launch_flags(app, config, texts);

  if (auto ended = parse_command_line(app, args, texts.job_file_path, job)) return *ended;
  if (auto done = take_script(app, job, config); !done) return done.error();
  config.stack_dumps = !texts.no_stack_dumps;
  config.preflight = texts.preflight == "fail" ? LaunchConfig::Preflight::kFail
                     : texts.preflight == "warn" || texts.preflight == "true"
                         ? LaunchConfig::Preflight::kWarn
                         : LaunchConfig::Preflight::kOff;
  config.stall.collective_timeout =
      texts.collective_timeout == "off" ? 0 : std::stod(texts.collective_timeout);
  config.stall.stragglers.window_s =
      texts.straggler_window == "off" ? 0 : std::stod(texts.straggler_window);
  if (auto done = apply_worker_texts(texts, config); !done) return done.error();

  // Under srun: what the step says, wherever the user set nothing (see launcher/config/slurm.hpp).
  auto set_by_user = [&](const std::string& dashed) {
    return app.count("--" + dashed) > 0 || job.flag_lines.contains(dashed) ||
           std::getenv(env_name_for(dashed).c_str()) != nullptr;
  };
  if (auto done = apply_slurm(config, current_environment(), set_by_user); !done)
    return done.error();
  if (auto done = apply_node_counts(config); !done) return done.error();
  if (auto done = complete_c10d_endpoint(config); !done) return done.error();
  if (auto done = complete_metrics_port(config); !done) return done.error();
  if (auto done = apply_rdzv_conf(config.rdzv_conf, config); !done) return done.error();
  if (auto done = apply_topology_labels(texts.labels, config); !done) return done.error();
  const bool static_master = endpoint_names_static_master(config);
  if (static_master)
    if (auto done = apply_static_master(app, config); !done) return done.error();
  if (auto done = check_master_and_backend(config); !done) return done.error();
  if (auto done = apply_signals_and_binding(texts, config); !done) return done.error();
  if (auto done = check_accepted_torchrun_flags(texts, config); !done) return done.error();
  if (auto done = resolve_term_timeout(app, job, texts, config); !done) return done.error();
  resolve_log_line_prefix(job, config);
  resolve_master_addr(app, job, static_master, config);
  return LaunchRequest{std::move(config)};
}

}  // namespace

Expected<LaunchRequest> parse_launch_config(const std::vector<std::string>& args) {
  JobFile job;
  auto result = parse_arguments(args, job);
  // A file's value that CLI11 took and mcprun's own checks refused is still named at its line.
  if (!result) return Error{job.locate(result.error().message)};
  return result;
}

Expected<std::vector<Endpoint>> etcd_members(const std::string& endpoints) {
  std::vector<Endpoint> members;
  std::stringstream in(unquoted(endpoints));
  for (std::string item; std::getline(in, item, ',');) {
    // torch's etcd backends take a bare HOST as HOST:2379, and an http:// or https:// prefix.
    std::string text = unquoted(item);
    for (std::string_view scheme : {"http://", "https://"})
      if (text.starts_with(scheme)) text.erase(0, scheme.size());
    if (text.empty()) continue;
    auto member = parse_endpoint(text, {.default_port = kEtcdDefaultPort});
    if (!member) return Error{"--rdzv-endpoint " + member.error().message + " (an etcd member)"};
    members.push_back(*member);
  }
  if (members.empty())
    return Error{"--rdzv-endpoint " + endpoints + ": expected the etcd members, HOST:PORT,..."};
  return members;
}

}  // namespace mcprun
