#include "launcher/config/launch_config.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <csignal>

#include "common/version.hpp"

namespace mcprun {
namespace {

LaunchConfig parse_ok(const std::vector<std::string>& args) {
  auto result = parse_launch_config(args);
  if (!result) ADD_FAILURE() << result.error().message;
  const bool launch = result && std::holds_alternative<LaunchConfig>(*result);
  EXPECT_TRUE(launch);
  return launch ? std::get<LaunchConfig>(*result) : LaunchConfig{};
}

std::string parse_error(const std::vector<std::string>& args) {
  auto result = parse_launch_config(args);
  EXPECT_FALSE(result);
  return result ? "" : result.error().message;
}

/// The --help (or --version) text, or "" after a failed expectation.
std::string info_text(const std::vector<std::string>& args) {
  auto result = parse_launch_config(args);
  EXPECT_TRUE(result && std::holds_alternative<InfoRequest>(*result));
  return result && std::holds_alternative<InfoRequest>(*result)
             ? std::get<InfoRequest>(*result).text
             : "";
}

TEST(LaunchConfig, BothSpellingsAndShortFlag) {
  for (const char* flag : {"--nproc-per-node", "--nproc_per_node", "-n"}) {
    LaunchConfig config = parse_ok({flag, "8", "train.py"});
    EXPECT_EQ(config.nproc.count, 8) << flag;
  }
  LaunchConfig config = parse_ok({"--nproc_per_node=4", "--master_port=29555", "--max_restarts",
                                  "2", "--log_dir", "/tmp/x", "train.py"});
  EXPECT_EQ(config.nproc.count, 4);
  EXPECT_EQ(config.master_port, 29555);
  EXPECT_EQ(config.max_restarts, 2);
  EXPECT_EQ(config.log_dir, "/tmp/x");
}

TEST(LaunchConfig, ScriptArgumentsPassThroughUntouched) {
  LaunchConfig config =
      parse_ok({"-n", "2", "train.py", "--lr", "3e-4", "-n", "5", "--", "--nproc-per-node", "x"});
  EXPECT_EQ(config.script, "train.py");
  EXPECT_EQ(config.script_args,
            (std::vector<std::string>{"--lr", "3e-4", "-n", "5", "--", "--nproc-per-node", "x"}));
  LaunchConfig dashed = parse_ok({"-n", "2", "--", "train.py", "--flag"});
  EXPECT_EQ(dashed.script, "train.py");
  EXPECT_EQ(dashed.script_args, std::vector<std::string>{"--flag"});
}

TEST(LaunchConfig, NprocWords) {
  EXPECT_EQ(parse_ok({"-n", "gpu", "t.py"}).nproc.kind, NprocSpec::Kind::kGpu);
  EXPECT_EQ(parse_ok({"-n", "cpu", "t.py"}).nproc.kind, NprocSpec::Kind::kCpu);
  EXPECT_EQ(parse_ok({"-n", "auto", "t.py"}).nproc.kind, NprocSpec::Kind::kAuto);
}

TEST(LaunchConfig, BadInputIsOneLine) {
  for (const auto& args :
       std::vector<std::vector<std::string>>{{"--bogus", "t.py"},
                                             {"-n", "0", "t.py"},
                                             {"-n", "-1", "t.py"},
                                             {"-n", "x", "t.py"},
                                             {"-r", "0:9", "t.py"},
                                             {"-r", "nonsense", "t.py"},
                                             {"--local-ranks-filter", "a", "t.py"},
                                             {"-n", "2"},
                                             {"--nnodes", "2:1", "t.py"},
                                             {"--nnodes", "2", "--rdzv-backend", "c10d", "t.py"},
                                             {"--nnodes", "1:2", "t.py"},
                                             {"--rdzv-conf", "bogus=1", "t.py"},
                                             {"--topology-labels", "rack", "t.py"},
                                             {"--start-method", "thread", "t.py"}}) {
    std::string message = parse_error(args);
    EXPECT_FALSE(message.empty()) << args[0];
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_NE(parse_error({"--bogus", "t.py"}).find("--bogus"), std::string::npos);
}

TEST(LaunchConfig, CollectiveTimeoutIsFiniteByDefaultAndOffTurnsItOff) {
  EXPECT_EQ(parse_ok({"t.py"}).stall.collective_timeout, 180);
  EXPECT_EQ(parse_ok({"--collective-timeout", "30", "t.py"}).stall.collective_timeout, 30);
  EXPECT_EQ(parse_ok({"--collective-timeout", "off", "t.py"}).stall.collective_timeout, 0);
  for (const char* bad : {"0", "-5", "soon", ""}) {
    const std::string message = parse_error({"--collective-timeout", bad, "t.py"});
    EXPECT_NE(message.find("--collective-timeout"), std::string::npos) << message;
    EXPECT_NE(message.find("seconds > 0 or off"), std::string::npos) << message;
  }
}

TEST(LaunchConfig, PreflightIsOffByDefaultAndTheBareFlagWarns) {
  using Preflight = LaunchConfig::Preflight;
  EXPECT_EQ(parse_ok({"t.py"}).preflight, Preflight::kOff);
  EXPECT_EQ(parse_ok({"--preflight", "t.py"}).preflight, Preflight::kWarn);
  EXPECT_EQ(parse_ok({"--preflight", "t.py"}).script, "t.py");
  EXPECT_EQ(parse_ok({"--preflight=fail", "t.py"}).preflight, Preflight::kFail);
  EXPECT_EQ(parse_ok({"--preflight=warn", "t.py"}).preflight, Preflight::kWarn);
  EXPECT_EQ(parse_ok({"--preflight=off", "t.py"}).preflight, Preflight::kOff);
  EXPECT_EQ(parse_ok({"t.py"}).preflight_timeout, 10);
  EXPECT_EQ(parse_ok({"--preflight-timeout", "3", "t.py"}).preflight_timeout, 3);
  const std::string message = parse_error({"--preflight=maybe", "t.py"});
  EXPECT_NE(message.find("--preflight"), std::string::npos) << message;
  EXPECT_NE(parse_error({"--preflight-timeout", "0", "t.py"}).find("--preflight-timeout"),
            std::string::npos);
}

TEST(LaunchConfig, StandaloneIsOneNode) {
  for (const char* nnodes : {"2", "1:2", "2:4"}) {
    const std::string message = parse_error({"--standalone", "--nnodes", nnodes, "t.py"});
    EXPECT_NE(message.find("--standalone is a one-node job, but --nnodes " + std::string(nnodes)),
              std::string::npos)
        << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  // What torchrun's docs show, its min:max spelling, and the rendezvous flags it ignores.
  for (const char* nnodes : {"1", "1:1"}) {
    LaunchConfig config = parse_ok({"--standalone", "--nnodes", nnodes, "-n", "4", "t.py"});
    EXPECT_TRUE(config.standalone);
    EXPECT_EQ(config.max_nodes, 1);
    EXPECT_EQ(config.master_addr, "127.0.0.1");
  }
  EXPECT_FALSE(
      parse_ok({"--standalone", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29400", "t.py"})
          .uses_rendezvous());
  ::setenv("PET_NNODES", "2", 1);
  EXPECT_NE(parse_error({"--standalone", "t.py"}).find("--nnodes 2"), std::string::npos);
  ::unsetenv("PET_NNODES");
}

TEST(LaunchConfig, StreamSpecs) {
  EXPECT_EQ(parse_stream_spec("3")->all, 3);
  auto per_rank = parse_stream_spec("0:1,2:3");
  ASSERT_TRUE(per_rank);
  EXPECT_EQ(per_rank->bits_for(0), 1);
  EXPECT_EQ(per_rank->bits_for(1), 0);
  EXPECT_EQ(per_rank->bits_for(2), 3);
  EXPECT_FALSE(parse_stream_spec("4"));
  EXPECT_FALSE(parse_stream_spec("0:"));
  EXPECT_FALSE(parse_stream_spec("a:1"));
}

TEST(LaunchConfig, PetVariablesSetFlagsAndFlagsWin) {
  ::setenv("PET_NPROC_PER_NODE", "3", 1);
  ::setenv("PET_MAX_RESTARTS", "4", 1);
  EXPECT_EQ(parse_ok({"t.py"}).nproc.count, 3);
  EXPECT_EQ(parse_ok({"t.py"}).max_restarts, 4);
  EXPECT_EQ(parse_ok({"-n", "2", "t.py"}).nproc.count, 2);
  ::unsetenv("PET_NPROC_PER_NODE");
  ::unsetenv("PET_MAX_RESTARTS");
}

TEST(LaunchConfig, ForkStartMethodWarnsAndIsIgnored) {
  LaunchConfig config = parse_ok({"--start-method", "fork", "t.py"});
  ASSERT_EQ(config.warnings.size(), 1u);
  EXPECT_NE(config.warnings[0].find("ignored"), std::string::npos);
}

TEST(LaunchConfig, HelpShowsDefaultsAndFiniteTimeouts) {
  const std::string help = info_text({"--help"});
  EXPECT_NE(help.find("--term-timeout"), std::string::npos);
  EXPECT_NE(help.find("10"), std::string::npos);
  EXPECT_NE(help.find("--nproc_per_node"), std::string::npos);
}

TEST(LaunchConfig, ArgparseAbbreviationsOfLongFlags) {
  EXPECT_EQ(parse_ok({"--redirect=3", "t.py"}).redirects.all, 3);
  EXPECT_EQ(parse_ok({"--redirect", "3", "t.py"}).redirects.all, 3);
  EXPECT_EQ(parse_ok({"--nproc_per=2", "t.py"}).nproc.count, 2);
  EXPECT_EQ(parse_ok({"--nproc-per=2", "t.py"}).nproc.count, 2);
  EXPECT_EQ(parse_ok({"--nproc", "2", "t.py"}).nproc.count, 2);  // Both spellings: one flag.
  EXPECT_EQ(parse_ok({"--max_rest", "2", "--stand", "t.py"}).max_restarts, 2);
  EXPECT_TRUE(parse_ok({"--max_rest", "2", "--stand", "t.py"}).standalone);
  EXPECT_EQ(parse_ok({"--master_a", "10.0.0.1", "t.py"}).master_addr, "10.0.0.1");
  // An option's value is not a flag, and the script is found after it.
  LaunchConfig config = parse_ok({"--rdzv-i", "--stand", "--tee", "1", "t.py", "--redirect=1"});
  EXPECT_EQ(config.rdzv_id, "--stand");
  EXPECT_FALSE(config.standalone);
  EXPECT_EQ(config.tee.all, 1);
  EXPECT_EQ(config.redirects.all, 0);
  EXPECT_EQ(config.script_args, std::vector<std::string>{"--redirect=1"});
  // Everything from the script on belongs to the script, prefixes included.
  LaunchConfig untouched = parse_ok({"-n", "2", "t.py", "--nproc", "5", "--stand"});
  EXPECT_EQ(untouched.script_args, (std::vector<std::string>{"--nproc", "5", "--stand"}));
  LaunchConfig dashed = parse_ok({"--", "t.py", "--redirect=3"});
  EXPECT_EQ(dashed.script_args, std::vector<std::string>{"--redirect=3"});
  EXPECT_EQ(parse_ok({"-n4", "t.py"}).nproc.count, 4);
}

TEST(LaunchConfig, AmbiguousPrefixNamesTheCandidates) {
  std::string message = parse_error({"--rdzv=x", "t.py"});
  for (const char* candidate : {"--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf"})
    EXPECT_NE(message.find(candidate), std::string::npos) << message;
  EXPECT_NE(message.find("ambiguous"), std::string::npos) << message;
  EXPECT_NE(parse_error({"--ma", "1", "t.py"}).find("--max-restarts"), std::string::npos);
  EXPECT_NE(parse_error({"--bogus-flag", "t.py"}).find("--bogus-flag"), std::string::npos);
}

TEST(LaunchConfig, QuotedRdzvConfIsUnquoted) {
  for (const char* text :
       {"'join_timeout=5,last_call_timeout=1'", "\"join_timeout=5,last_call_timeout=1\"",
        "'join_timeout=5','last_call_timeout=1'", "join_timeout='5',last_call_timeout=\"1\"",
        " join_timeout = 5 , last_call_timeout=1 "}) {
    LaunchConfig config = parse_ok({"--rdzv-conf", text, "t.py"});
    EXPECT_EQ(config.join_timeout, 5) << text;
    EXPECT_EQ(config.last_call_timeout, 1) << text;
    EXPECT_TRUE(config.warnings.empty()) << text;
  }
  EXPECT_EQ(parse_ok({"--rdzv_conf='join_timeout=7'", "t.py"}).join_timeout, 7);
}

TEST(LaunchConfig, TorchrunRdzvConfKeysAreAcceptedWithOneWarning) {
  LaunchConfig config = parse_ok(
      {"--rdzv-conf",
       "join_timeout=5,timeout=5,close_timeout=10,read_timeout=60,heartbeat_timeout=3,"
       "keep_alive_interval=5,keep_alive_max_attempt=3,store_type=tcp,use_libuv=1,is_host=yes",
       "t.py"});
  EXPECT_EQ(config.join_timeout, 5);
  EXPECT_EQ(config.is_host, true);
  ASSERT_EQ(config.warnings.size(), 1u);
  for (const char* key :
       {"timeout", "close_timeout", "read_timeout", "heartbeat_timeout", "keep_alive_interval",
        "keep_alive_max_attempt", "store_type", "use_libuv"})
    EXPECT_NE(config.warnings[0].find(key), std::string::npos) << key;
  EXPECT_EQ(parse_ok({"--rdzv-conf", "is_host=F", "t.py"}).is_host, false);
  // Honoured keys with malformed values, a missing value and unknown keys are usage errors.
  for (const char* text : {"join_timeout=soon", "last_call_timeout=-1", "is_host=maybe",
                           "join_timeout=", "join_timout=5"})
    EXPECT_NE(parse_error({"--rdzv-conf", text, "t.py"}).find("--rdzv-conf"), std::string::npos)
        << text;
}

TEST(LaunchConfig, EtcdBackendsTakeTheMembersAndTorchrunsEtcdKeys) {
  for (const char* backend : {"etcd", "etcd-v2"}) {
    LaunchConfig config = parse_ok(
        {"--nnodes", "2:4", "--rdzv-backend", backend, "--rdzv-endpoint",
         "e1:2379,https://e2,e3:2381", "--rdzv-conf",
         "timeout=30,last_call_timeout=2,protocol=https,cacert=ca.pem,cert=c.pem,key=k.pem",
         "t.py"});
    EXPECT_TRUE(config.uses_etcd());
    EXPECT_EQ(config.join_timeout, 30);
    EXPECT_EQ(config.last_call_timeout, 2);
    EXPECT_TRUE(config.etcd_tls.https);
    EXPECT_EQ(config.etcd_tls.cacert, "ca.pem");
    EXPECT_EQ(config.etcd_tls.cert, "c.pem");
    EXPECT_EQ(config.etcd_tls.key, "k.pem");
    EXPECT_TRUE(config.warnings.empty()) << config.warnings[0];
    auto members = etcd_members(config.rdzv_endpoint);
    ASSERT_TRUE(members) << members.error().message;
    EXPECT_EQ(*members,
              (std::vector<Endpoint>{{"e1", 2379, ""}, {"e2", 2379, ""}, {"e3", 2381, ""}}));
  }
  // Every mistake in the members or the TLS keys is one line before anything starts.
  const std::vector<std::string> etcd = {"--nnodes", "2", "--rdzv-backend", "etcd"};
  for (const auto& extra : std::vector<std::vector<std::string>>{
           {"--rdzv-endpoint", "e1:99999"},
           {"--rdzv-endpoint", ","},
           {"--rdzv-endpoint", "e1", "--rdzv-conf", "protocol=ftp"},
           {"--rdzv-endpoint", "e1", "--rdzv-conf", "protocol=https,cert=c.pem"},
           {"--rdzv-endpoint", "e1", "--rdzv-conf", "cacert=ca.pem"},
           {"--rdzv-endpoint", "e1", "--rdzv-conf", "timeout=never"}}) {
    std::vector<std::string> args = etcd;
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("t.py");
    const std::string message = parse_error(args);
    EXPECT_NE(message.find("--rdzv-"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_NE(
      parse_error({"--nnodes", "2", "--rdzv-backend", "zookeeper", "--rdzv-endpoint", "z", "t.py"})
          .find("expected static, c10d, or etcd"),
      std::string::npos);
}

TEST(LaunchConfig, StaticRdzvEndpointIsTheMaster) {
  LaunchConfig config = parse_ok({"--rdzv-endpoint", "10.1.2.3:29611", "t.py"});
  EXPECT_EQ(config.master_addr, "10.1.2.3");
  EXPECT_EQ(config.master_port, 29611);
  // As torchrun's get_rdzv_endpoint: the endpoint beats --master-addr/--master-port.
  LaunchConfig both = parse_ok({"--master-addr", "10.9.9.9", "--master-port", "1234",
                                "--rdzv_endpoint=node0:29611", "--nnodes", "2", "t.py"});
  EXPECT_EQ(both.master_addr, "node0");
  EXPECT_EQ(both.master_port, 29611);
  EXPECT_EQ(both.warnings.size(), 2u);
  LaunchConfig ipv6 = parse_ok({"--rdzv-endpoint", "[::1]:29612", "t.py"});
  EXPECT_EQ(ipv6.master_addr, "::1");
  EXPECT_EQ(ipv6.master_port, 29612);
  // Without a port torchrun's static rendezvous refuses; so does mcprun.
  EXPECT_NE(parse_error({"--rdzv-endpoint", "node0", "t.py"}).find("--rdzv-endpoint"),
            std::string::npos);
  EXPECT_NE(parse_error({"--rdzv-endpoint", "node0:http", "t.py"}).find("--rdzv-endpoint"),
            std::string::npos);
  // c10d: the endpoint is the rendezvous, not the master.
  LaunchConfig c10d = parse_ok(
      {"--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29400", "--nnodes", "1:2", "t.py"});
  EXPECT_EQ(c10d.master_addr, "127.0.0.1");
  EXPECT_EQ(c10d.rdzv_endpoint, "node0:29400");
}

TEST(LaunchConfig, C10dEndpointWithoutPortIsTorchrunsDefault29400) {
  // torch's c10d backend: parse_rendezvous_endpoint(endpoint, default_port=29400).
  for (const auto& [given, meant] :
       std::vector<std::pair<std::string, std::string>>{{"node0", "node0:29400"},
                                                        {"[fd00::1]", "[fd00::1]:29400"},
                                                        {"node0:29555", "node0:29555"},
                                                        {"unix:/run/r.sock", "unix:/run/r.sock"}}) {
    LaunchConfig config =
        parse_ok({"--rdzv-backend", "c10d", "--rdzv-endpoint", given, "--nnodes", "2", "t.py"});
    EXPECT_EQ(config.rdzv_endpoint, meant) << given;
  }
  EXPECT_NE(
      parse_error({"--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:x", "--nnodes", "2", "t.py"})
          .find("--rdzv-endpoint 'node0:x'"),
      std::string::npos);
}

TEST(LaunchConfig, SignalsToHandle) {
  EXPECT_EQ(parse_ok({"t.py"}).signals_to_handle,
            (std::set<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT}));
  LaunchConfig slurm = parse_ok({"--signals-to-handle", "SIGTERM,SIGINT,SIGUSR1,SIGUSR2", "t.py"});
  EXPECT_EQ(slurm.signals_to_handle, (std::set<int>{SIGTERM, SIGINT, SIGUSR1, SIGUSR2}));
  EXPECT_EQ(parse_ok({"--signals_to_handle=SIGTERM, USR1", "t.py"}).signals_to_handle,
            (std::set<int>{SIGTERM, SIGUSR1}));
  ::setenv("PET_SIGNALS_TO_HANDLE", "SIGUSR2", 1);
  EXPECT_EQ(parse_ok({"t.py"}).signals_to_handle, std::set<int>{SIGUSR2});
  ::unsetenv("PET_SIGNALS_TO_HANDLE");
  EXPECT_TRUE(forwarded_only(SIGUSR1));
  EXPECT_FALSE(forwarded_only(SIGTERM));
  for (const char* bad : {"SIGTERM,SIGFOO", "SIGKILL", "SIGCHLD", "15"}) {
    std::string message = parse_error({"--signals-to-handle", bad, "t.py"});
    EXPECT_NE(message.find("--signals-to-handle"), std::string::npos) << bad;
    EXPECT_NE(message.find("SIGUSR1"), std::string::npos) << message;
  }
}

TEST(LaunchConfig, NumaBindingAndVirtualLocalRank) {
  EXPECT_FALSE(parse_ok({"t.py"}).numa_binding);
  EXPECT_FALSE(parse_ok({"t.py"}).virtual_local_rank);
  using Mode = NumaBinding;
  EXPECT_EQ(parse_ok({"--numa-binding", "node", "t.py"}).numa_binding, Mode::kNode);
  EXPECT_EQ(parse_ok({"--numa_binding=socket", "t.py"}).numa_binding, Mode::kSocket);
  EXPECT_EQ(parse_ok({"--numa-binding", "exclusive", "t.py"}).numa_binding, Mode::kExclusive);
  EXPECT_EQ(parse_ok({"--numa-binding", "core-complex", "t.py"}).numa_binding, Mode::kCoreComplex);
  std::string message = parse_error({"--numa-binding", "rack", "t.py"});
  EXPECT_NE(message.find("core-complex"), std::string::npos) << message;
  EXPECT_TRUE(parse_ok({"--virtual-local-rank", "t.py"}).virtual_local_rank);
  EXPECT_TRUE(parse_ok({"--virtual_local_rank", "t.py"}).virtual_local_rank);
}

TEST(LaunchConfig, TorchrunOnlyFlagsAreAcceptedHonestly) {
  EXPECT_TRUE(parse_ok({"--event-log-handler", "null", "t.py"}).warnings.empty());
  LaunchConfig handler = parse_ok({"--event_log_handler=scuba", "t.py"});
  ASSERT_EQ(handler.warnings.size(), 1u);
  EXPECT_NE(handler.warnings[0].find("event log"), std::string::npos);
  parse_ok({"--logs-specs", "default", "t.py"});
  parse_ok({"--logs_specs=default", "t.py"});
  EXPECT_NE(parse_error({"--logs_specs=DOESNOT_EXIST", "t.py"}).find("--logs-specs"),
            std::string::npos);
  parse_ok({"--duplicate-stdout-filters", "''", "--duplicate_stderr_filters=''", "t.py"});
  EXPECT_NE(parse_error({"--duplicate-stdout-filters", "apple,orange", "t.py"}).find("apple"),
            std::string::npos);
  EXPECT_NE(parse_error({"-n", "xpu", "t.py"}).find("NVIDIA"), std::string::npos);
  EXPECT_EQ(parse_ok({"--shutdown-timeout", "3", "t.py"}).term_timeout, 3);
  EXPECT_EQ(parse_ok({"--shutdown_timeout=3", "--term-timeout", "4", "t.py"}).term_timeout, 4);
  ::setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7", 1);
  EXPECT_EQ(parse_ok({"t.py"}).term_timeout, 7);
  EXPECT_EQ(parse_ok({"--shutdown-timeout", "3", "t.py"}).term_timeout, 3);
  ::unsetenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
  EXPECT_EQ(parse_ok({"t.py"}).term_timeout, 10);
  // The rest of torch 2.x's run.py, as users type them.
  LaunchConfig config =
      parse_ok({"--nnodes=1", "--nproc_per_node=2", "--rdzv_id=job7", "--rdzv_backend=static",
                "--monitor_interval=1", "--start_method=spawn", "--role=trainer",
                "--log_dir=/tmp/l", "--redirects=0:3", "--tee=1", "--local_ranks_filter=0",
                "--node_rank=0", "--master_addr=localhost", "--master_port=29501",
                "--local_addr=127.0.0.1", "--max_restarts=1", "--run_path", "t.py"});
  EXPECT_EQ(config.role, "trainer");
  EXPECT_EQ(config.rdzv_id, "job7");
  EXPECT_EQ(config.master_addr, "localhost");
  EXPECT_TRUE(config.run_path);
}

TEST(LaunchConfig, LogLinePrefixTemplateIsReadFromTheEnvironment) {
  EXPECT_FALSE(parse_ok({"t.py"}).log_line_prefix_template);
  ::setenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${role_name}${rank}]: ", 1);
  EXPECT_EQ(parse_ok({"t.py"}).log_line_prefix_template, "[${role_name}${rank}]: ");
  ::setenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "", 1);  // Empty: torchrun's default.
  EXPECT_FALSE(parse_ok({"t.py"}).log_line_prefix_template);
  ::unsetenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
}

TEST(LaunchConfig, HelpNamesTorchrun2Flags) {
  const std::string help = info_text({"--help"});
  for (const char* flag : {"--signals-to-handle", "--numa-binding", "--virtual-local-rank",
                           "--event-log-handler", "--logs-specs", "--shutdown-timeout",
                           "--duplicate-stdout-filters", "SIGUSR1", "core-complex"})
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
}

TEST(LaunchConfig, VersionIsCMakesProjectVersion) {
  EXPECT_EQ(info_text({"--version"}), "mcprun " + mcprun_version() + "\n");
  EXPECT_EQ(mcprun_version(), MCPRUN_PROJECT_VERSION);
}

}  // namespace
}  // namespace mcprun
