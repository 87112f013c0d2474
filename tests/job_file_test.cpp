#include "launcher/config/job_file.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "launcher/config/launch_config.hpp"
#include "tests/temp_dir.hpp"

namespace mcprun {
namespace {

/// A job file in a fresh temp folder, removed with the test.
class JobFileTest : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    const std::string path = (dir_ / "job.yaml").string();
    std::ofstream(path) << text;
    return path;
  }
  LaunchConfig parse_ok(std::vector<std::string> args) {
    auto result = parse_launch_config(args);
    if (!result) ADD_FAILURE() << result.error().message;
    return result && std::holds_alternative<LaunchConfig>(*result) ? std::get<LaunchConfig>(*result)
                                                                   : LaunchConfig{};
  }
  std::string parse_error(std::vector<std::string> args) {
    auto result = parse_launch_config(args);
    EXPECT_FALSE(result);
    return result ? "" : result.error().message;
  }

  testing::TempDir dir_{"job_file_test"};
};

TEST_F(JobFileTest, EveryKindOfFlagInBothSpellings) {
  const std::string path = write(R"(# A CI job
nproc-per-node: 2
nnodes: 1
max_restarts: 1
term-timeout: 2.5
timeout: 600
init_timeout: 30
collective-timeout: 45
no-python: true
standalone: no
start-method: spawn
rdzv-conf: {join_timeout: 60, last_call_timeout: 1}
topology-labels: {rack: r1}
local-ranks-filter: [0, 1]
redirects: {1: 3}
log-dir: /tmp/logs
summary-json: out/summary.json
junit: out/junit.xml
env:
  FOO: bar
  EMPTY:
  N: 3
script: /bin/echo
args: [--lr, 3e-4, "-n"]
)");
  LaunchConfig config = parse_ok({"--config", path});
  EXPECT_EQ(config.nproc.count, 2);
  EXPECT_EQ(config.max_restarts, 1);
  EXPECT_DOUBLE_EQ(config.term_timeout, 2.5);
  EXPECT_DOUBLE_EQ(config.job_timeout, 600);
  EXPECT_DOUBLE_EQ(config.stall.init_timeout, 30);
  EXPECT_DOUBLE_EQ(config.stall.collective_timeout, 45);
  EXPECT_TRUE(config.no_python);
  EXPECT_FALSE(config.standalone);
  EXPECT_DOUBLE_EQ(config.join_timeout, 60);
  EXPECT_DOUBLE_EQ(config.last_call_timeout, 1);
  EXPECT_EQ(config.topology_labels.at("rack"), "r1");
  EXPECT_EQ(config.local_ranks_filter, (std::set<int>{0, 1}));
  EXPECT_EQ(config.redirects.bits_for(1), 3);
  EXPECT_EQ(config.log_dir, "/tmp/logs");
  EXPECT_EQ(config.summary_json, "out/summary.json");
  EXPECT_EQ(config.junit, "out/junit.xml");
  EXPECT_EQ(config.env,
            (std::map<std::string, std::string>{{"FOO", "bar"}, {"EMPTY", ""}, {"N", "3"}}));
  EXPECT_EQ(config.script, "/bin/echo");
  EXPECT_EQ(config.script_args, (std::vector<std::string>{"--lr", "3e-4", "-n"}));
}

TEST_F(JobFileTest, TheCommandLineBeatsTheFileWhichBeatsPetVariables) {
  const std::string path =
      write("nproc-per-node: 2\nmax-restarts: 3\nscript: /bin/echo\nargs: [file]\n");
  ::setenv("PET_MAX_RESTARTS", "7", 1);
  ::setenv("PET_TERM_TIMEOUT", "4", 1);
  LaunchConfig config = parse_ok({"--config", path, "-n", "1"});
  EXPECT_EQ(config.nproc.count, 1);
  EXPECT_EQ(config.max_restarts, 3);         // The file beats PET_MAX_RESTARTS.
  EXPECT_DOUBLE_EQ(config.term_timeout, 4);  // PET_* still sets what the file leaves alone.
  EXPECT_EQ(config.script_args, std::vector<std::string>{"file"});
  LaunchConfig own_script = parse_ok({"--config", path, "/bin/true", "cli"});
  EXPECT_EQ(own_script.script,
            "/bin/true");  // A script on the command line replaces script: and args:.
  EXPECT_EQ(own_script.script_args, std::vector<std::string>{"cli"});
  EXPECT_EQ(parse_ok({"--config", path, "--max-restarts", "0"}).max_restarts, 0);
  ::unsetenv("PET_MAX_RESTARTS");
  ::unsetenv("PET_TERM_TIMEOUT");
}

TEST_F(JobFileTest, UnknownKeyNamesItsLineAndTheNearestFlag) {
  const std::string path = write("nnodes: 1\n\n# comment\nnprocs: 2\nscript: t.py\n");
  EXPECT_EQ(parse_error({"--config", path}),
            path + ":4: unknown key 'nprocs' (did you mean nproc-per-node?)");
  const std::string typo = write("init_timout: 5\n");
  EXPECT_EQ(parse_error({"--config", typo}),
            typo + ":1: unknown key 'init_timout' (did you mean init-timeout?)");
  const std::string far = write("colour: blue\n");
  EXPECT_EQ(parse_error({"--config", far}), far + ":1: unknown key 'colour'");
}

TEST_F(JobFileTest, WrongShapesAndValuesNameKeyLineAndWhatWasExpected) {
  const std::map<std::string, std::string> cases{
      {"script: t.py\nnnodes: {min: 1}\n", ":2: nnodes: expected a string, got a map"},
      {"max-restarts: lots\n", ":1: max-restarts: expected a whole number >= 0, got 'lots'"},
      {"term-timeout: -1\n", ":1: term-timeout: expected a number >= 0, got '-1'"},
      {"no-python: maybe\n", ":1: no-python: expected true or false, got 'maybe'"},
      {"start-method: thread\n",
       ":1: start-method: expected one of spawn, fork, forkserver, got 'thread'"},
      {"gpus: {a: 1}\n", ":1: gpus: expected a string or a list, got a map"},
      {"args: --lr\nscript: t.py\n", ":1: args: expected a list of arguments, got '--lr'"},
      {"env: [A]\n", ":1: env: expected a map of NAME: value, got a list"},
      {"env:\n  A: [1]\n", ":2: env: A: expected a string, got a list"},
      {"nproc-per-node: 2\nnproc_per_node: 3\n", ":2: nproc_per_node: already set on line 1"},
      {"config: other.yaml\n", ":1: config: only meaningful on the command line"},
      {"args: [x]\n", ":1: args: needs script: beside it"},
      {"- nproc-per-node\n", ": expected a map of flags (nproc-per-node: 2, ...), got a list"},
      {"nnodes: [1\n", ":2: not valid YAML: end of sequence flow not found"},
  };
  for (const auto& [text, message] : cases) {
    const std::string path = write(text);
    EXPECT_EQ(parse_error({"--config", path}), path + message) << text;
  }
  EXPECT_EQ(parse_error({"--config", (dir_ / "missing.yaml").string()}),
            (dir_ / "missing.yaml").string() + ": cannot read the job file");
}

TEST_F(JobFileTest, PreflightTakesItsValueOrABool) {
  using Preflight = LaunchConfig::Preflight;
  EXPECT_EQ(parse_ok({"--config", write("preflight: fail\nscript: t.py\n")}).preflight,
            Preflight::kFail);
  EXPECT_EQ(parse_ok({"--config", write("preflight: true\nscript: t.py\n")}).preflight,
            Preflight::kWarn);
  EXPECT_EQ(parse_ok({"--config", write("preflight: no\nscript: t.py\n")}).preflight,
            Preflight::kOff);
  const std::string path = write("preflight: maybe\nscript: t.py\n");
  EXPECT_NE(parse_error({"--config", path}).find(path + ":1: preflight: expected"),
            std::string::npos);
}

TEST_F(JobFileTest, McprunsOwnChecksOfAFileValueNameItsLine) {
  const std::string path = write("script: t.py\nnnodes: 2:1\n");
  EXPECT_EQ(parse_error({"--config", path}),
            path + ":2: --nnodes 2:1: expected N or MIN:MAX with 1 <= MIN <= MAX");
  // Overridden on the command line, the value is the command line's, and so is the error.
  EXPECT_EQ(parse_error({"--config", path, "--nnodes", "0"}),
            "--nnodes 0: expected N or MIN:MAX with 1 <= MIN <= MAX");
}

TEST_F(JobFileTest, EmptyFileAndEmptyKeysKeepTheDefaults) {
  EXPECT_EQ(parse_ok({"--config", write(""), "t.py"}).nproc.count, 1);
  LaunchConfig config = parse_ok({"--config", write("log-dir:\nmax-restarts: ~\n"), "t.py"});
  EXPECT_EQ(config.log_dir, "");
  EXPECT_EQ(config.max_restarts, 0);
}

TEST_F(JobFileTest, TheExamplesInConfigsParse) {
  const std::string configs = std::string(MCPRUN_SOURCE_DIR) + "/configs/";
  LaunchConfig smoke = parse_ok({"--config", configs + "ci-smoke.yaml"});
  EXPECT_EQ(smoke.nproc.count, 2);
  EXPECT_TRUE(smoke.no_pin);
  EXPECT_GT(smoke.job_timeout, 0);
  EXPECT_GT(smoke.stall.init_timeout, 0);
  EXPECT_FALSE(smoke.summary_json.empty());
  EXPECT_FALSE(smoke.junit.empty());
  EXPECT_EQ(smoke.script, "examples/ddp_train.py");
  LaunchConfig multinode = parse_ok({"--config", configs + "job-multinode.yaml"});
  EXPECT_EQ(multinode.max_nodes, 4);
  EXPECT_TRUE(multinode.uses_rendezvous());
  EXPECT_DOUBLE_EQ(multinode.join_timeout, 300);
  EXPECT_EQ(multinode.script_args, (std::vector<std::string>{"--epochs", "10", "--lr", "3e-4"}));
}

TEST_F(JobFileTest, EveryFlagHasAKey) {
  // The file goes through the command line's own options, so --help's flags are its keys.
  CLI::App app;
  std::string text;
  bool on = false;
  app.add_option("--some-text,--some_text", text);
  app.add_flag("--some-flag", on);
  auto loaded = apply_job_file(app, write("some_text: hello\nsome-flag: yes\n"));
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(text, "hello");
  EXPECT_TRUE(on);
  EXPECT_EQ(loaded->flag_lines, (std::map<std::string, int>{{"some-text", 1}, {"some-flag", 2}}));
}

}  // namespace
}  // namespace mcprun
