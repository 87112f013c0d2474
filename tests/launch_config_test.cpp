#include "launcher/launch_config.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace mcprun {
namespace {

LaunchConfig parse_ok(const std::vector<std::string>& args) {
  ParseResult result = parse_launch_config(args);
  if (auto* error = std::get_if<UsageError>(&result)) ADD_FAILURE() << error->message;
  EXPECT_TRUE(std::holds_alternative<LaunchConfig>(result));
  return std::holds_alternative<LaunchConfig>(result) ? std::get<LaunchConfig>(result)
                                                      : LaunchConfig{};
}

std::string parse_error(const std::vector<std::string>& args) {
  ParseResult result = parse_launch_config(args);
  EXPECT_TRUE(std::holds_alternative<UsageError>(result));
  auto* error = std::get_if<UsageError>(&result);
  return error ? error->message : "";
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
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--bogus", "t.py"}, {"-n", "0", "t.py"}, {"-n", "-1", "t.py"}, {"-n", "x", "t.py"},
           {"-r", "0:9", "t.py"}, {"-r", "nonsense", "t.py"}, {"--local-ranks-filter", "a", "t.py"},
           {"-n", "2"}, {"--nnodes", "2:1", "t.py"}, {"--nnodes", "2", "--rdzv-backend", "c10d", "t.py"},
           {"--nnodes", "1:2", "t.py"}, {"--rdzv-conf", "bogus=1", "t.py"},
           {"--topology-labels", "rack", "t.py"}, {"--start-method", "thread", "t.py"}}) {
    std::string message = parse_error(args);
    EXPECT_FALSE(message.empty()) << args[0];
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_NE(parse_error({"--bogus", "t.py"}).find("--bogus"), std::string::npos);
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
  ParseResult result = parse_launch_config({"--help"});
  ASSERT_TRUE(std::holds_alternative<InfoRequest>(result));
  const std::string& help = std::get<InfoRequest>(result).text;
  EXPECT_NE(help.find("--term-timeout"), std::string::npos);
  EXPECT_NE(help.find("10"), std::string::npos);
  EXPECT_NE(help.find("--nproc_per_node"), std::string::npos);
}

}  // namespace
}  // namespace mcprun
