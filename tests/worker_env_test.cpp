#include "launcher/plan/worker_env.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "launcher/plan/torch_version.hpp"
#include "tests/temp_dir.hpp"

namespace mcprun {
namespace {

JobIdentity four_rank_job() {
  return JobIdentity{
      "127.0.0.1", 29511, "job7", "trainer", 2, 4, 4, 0, 1, false, "SIGTERM,SIGINT,SIGHUP,SIGQUIT"};
}

WorkerIdentity worker(int local_rank, std::vector<std::string> visible_gpus = {}) {
  WorkerIdentity identity;
  identity.local_rank = identity.rank = local_rank;
  identity.visible_gpus = std::move(visible_gpus);
  return identity;
}

TEST(WorkerEnv, TorchrunContract) {
  Environment env =
      worker_env_delta(four_rank_job(), worker(2), 1, "/run/attempt_1/2/error.json", {});
  EXPECT_EQ(env["RANK"], "2");
  EXPECT_EQ(env["LOCAL_RANK"], "2");
  EXPECT_EQ(env["GROUP_RANK"], "0");
  EXPECT_EQ(env["ROLE_RANK"], "2");
  EXPECT_EQ(env["ROLE_NAME"], "trainer");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(env["WORLD_SIZE"], "4");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "1");
  EXPECT_EQ(env["ROLE_WORLD_SIZE"], "4");
  EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "29511");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "1");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "2");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "job7");
  EXPECT_EQ(env["TORCHELASTIC_SIGNALS_TO_HANDLE"], "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
  EXPECT_EQ(env["TORCHELASTIC_ERROR_FILE"], "/run/attempt_1/2/error.json");
  EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");  // torchrun 2.x's name only.
  EXPECT_FALSE(env.contains("NCCL_ASYNC_ERROR_HANDLING"));
  EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
  EXPECT_FALSE(env.contains("CUDA_VISIBLE_DEVICES"));
}

TEST(WorkerEnv, OnlyTheNameTheWorkersTorchReadsIsSet) {
  JobIdentity legacy = four_rank_job();
  legacy.nccl_async_error_handling = "NCCL_ASYNC_ERROR_HANDLING";  // torch 1.13, as its torchrun.
  Environment env = worker_env_delta(legacy, worker(0), 0, "e", {});
  EXPECT_EQ(env["NCCL_ASYNC_ERROR_HANDLING"], "1");
  EXPECT_FALSE(env.contains("TORCH_NCCL_ASYNC_ERROR_HANDLING"));
}

TEST(WorkerEnv, UserSettingsKept) {
  // Either name exported reaches the worker unchanged: one is kept, the other inherited as is.
  Environment inherited{{"OMP_NUM_THREADS", "6"},
                        {"NCCL_ASYNC_ERROR_HANDLING", "0"},
                        {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}};
  Environment env = worker_env_delta(four_rank_job(), worker(0), 0, "e", inherited);
  EXPECT_FALSE(env.contains("OMP_NUM_THREADS"));
  EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "3");
  EXPECT_FALSE(env.contains("NCCL_ASYNC_ERROR_HANDLING"));
  const auto merged = merge_environment(inherited, env);
  EXPECT_NE(std::find(merged.begin(), merged.end(), "NCCL_ASYNC_ERROR_HANDLING=0"), merged.end());
  EXPECT_NE(std::find(merged.begin(), merged.end(), "TORCH_NCCL_ASYNC_ERROR_HANDLING=3"),
            merged.end());
  JobIdentity single = four_rank_job();
  single.local_world_size = single.world_size = 1;
  EXPECT_FALSE(worker_env_delta(single, worker(0), 0, "e", {}).contains("OMP_NUM_THREADS"));
}

TEST(WorkerEnv, PinnedWorkerSeesTheNodesGpusSoLocalRankIndexesThem) {
  Environment env = worker_env_delta(four_rank_job(),
                                     worker(2, {"GPU-a", "GPU-b", "GPU-c", "GPU-d"}), 0, "e", {});
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "GPU-a,GPU-b,GPU-c,GPU-d");
  EXPECT_EQ(env["LOCAL_RANK"], "2");
  EXPECT_EQ(env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
}

TEST(WorkerEnv, VirtualLocalRankIsZeroWithOneVisibleGpu) {
  JobIdentity job = four_rank_job();
  job.virtual_local_rank = true;
  Environment env = worker_env_delta(job, worker(3, {"5"}), 0, "e", {});
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "5");
  EXPECT_EQ(env["LOCAL_RANK"], "0");
  EXPECT_EQ(env["RANK"], "3");
}

TEST(WorkerEnv, InheritedLauncherVariablesAreReplacedWithAWarning) {
  Environment inherited{{"RANK", "5"},
                        {"MASTER_ADDR", "10.1.1.1"},
                        {"MASTER_PORT", "29500"},
                        {"TORCHELASTIC_RUN_ID", "old"},
                        {"OMP_NUM_THREADS", "2"},
                        {"HOME", "/root"}};
  auto warnings = environment_warnings(four_rank_job(), inherited);
  ASSERT_EQ(warnings.size(), 4u);
  auto mentions = [&](const std::string& a, const std::string& b) {
    return std::any_of(warnings.begin(), warnings.end(), [&](const std::string& w) {
      return w.find(a) != std::string::npos && w.find(b) != std::string::npos;
    });
  };
  EXPECT_TRUE(mentions("MASTER_ADDR='10.1.1.1'", "'127.0.0.1'"));
  EXPECT_TRUE(mentions("MASTER_PORT='29500'", "'29511'"));
  EXPECT_TRUE(mentions("RANK='5'", "per-worker"));
  EXPECT_TRUE(mentions("TORCHELASTIC_RUN_ID='old'", "'job7'"));

  auto merged =
      merge_environment(inherited, worker_env_delta(four_rank_job(), worker(1), 0, "e", inherited));
  auto has = [&](const std::string& entry) {
    return std::find(merged.begin(), merged.end(), entry) != merged.end();
  };
  EXPECT_TRUE(has("RANK=1"));
  EXPECT_TRUE(has("MASTER_ADDR=127.0.0.1"));
  EXPECT_TRUE(has("HOME=/root"));
  EXPECT_FALSE(has("RANK=5"));
  EXPECT_FALSE(has("TORCHELASTIC_RUN_ID=old"));
}

TEST(TorchVersion, ParsesWhatInstallsWrite) {
  EXPECT_EQ(parse_torch_version("2.13.0+cpu")->minor, 13);
  EXPECT_EQ(parse_torch_version("2.13.0+cpu.dist-info")->text, "2.13.0+cpu");
  EXPECT_EQ(parse_torch_version("1.13.0a0+gitunknown.egg-info")->major, 1);
  EXPECT_EQ(parse_torch_version("2.1.2-py3.10.egg-info")->text, "2.1.2");
  EXPECT_FALSE(parse_torch_version("nightly"));
  EXPECT_FALSE(parse_torch_version("2"));
}

TEST(TorchVersion, TheNameFollowsTheTorchrunOfThatTorch) {
  EXPECT_EQ(nccl_async_error_handling_variable(parse_torch_version("1.13.0a0")),
            "NCCL_ASYNC_ERROR_HANDLING");
  EXPECT_EQ(nccl_async_error_handling_variable(parse_torch_version("2.1.2")),
            "NCCL_ASYNC_ERROR_HANDLING");
  EXPECT_EQ(nccl_async_error_handling_variable(parse_torch_version("2.2.0")),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING");
  EXPECT_EQ(nccl_async_error_handling_variable(parse_torch_version("2.13.0+cpu")),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING");
  EXPECT_EQ(nccl_async_error_handling_variable(std::nullopt), "TORCH_NCCL_ASYNC_ERROR_HANDLING");
}

/// A fake install: <root>/bin/python3.11 and, where given, torch under
/// lib/python3.11/site-packages.
struct FakeInstall {
  testing::TempDir root{"mcprun-python"};
  std::filesystem::path python() const { return root.path() / "bin" / "python3.11"; }
  std::filesystem::path site() const { return root.path() / "lib/python3.11/site-packages"; }
  FakeInstall() {
    std::filesystem::create_directories(root.path() / "bin");
    std::ofstream(python()) << "#!/bin/false\n";
  }
  void torch_version_py(const std::filesystem::path& dir, const std::string& version) const {
    std::filesystem::create_directories(dir / "torch");
    std::ofstream(dir / "torch/version.py") << "from typing import Optional\n\n__all__ = []\n"
                                            << "__version__ = '" << version << "'\ndebug = False\n";
  }
};

TEST(TorchVersion, ReadsTheInterpretersOwnSitePackages) {
  FakeInstall install;
  EXPECT_FALSE(installed_torch_version(python_package_dirs(install.python(), {})));
  install.torch_version_py(install.site(), "2.13.0+cpu");
  auto found = installed_torch_version(python_package_dirs(install.python(), {}));
  ASSERT_TRUE(found);
  EXPECT_EQ(found->text, "2.13.0+cpu");
  // PYTHONPATH comes first, as Python searches it first.
  testing::TempDir path("mcprun-pythonpath");
  install.torch_version_py(path.path(), "1.13.1");
  found = installed_torch_version(
      python_package_dirs(install.python(), {{"PYTHONPATH", path.path().string()}}));
  ASSERT_TRUE(found);
  EXPECT_EQ(found->minor, 13);
  EXPECT_EQ(found->major, 1);
}

TEST(TorchVersion, AVenvIsReadThroughItsSymlinkedInterpreter) {
  FakeInstall base;
  base.torch_version_py(base.site(), "1.13.0a0");
  testing::TempDir venv("mcprun-venv");
  std::filesystem::create_directories(venv.path() / "bin");
  std::filesystem::create_symlink(base.python(), venv.path() / "bin/python");
  std::ofstream(venv.path() / "pyvenv.cfg")
      << "home = /usr/bin\ninclude-system-site-packages = false\n"
         "version = 3.11.2\n";
  EXPECT_FALSE(installed_torch_version(python_package_dirs(venv.path() / "bin/python", {})));
  base.torch_version_py(venv.path() / "lib/python3.11/site-packages", "2.13.0+cpu");
  EXPECT_EQ(installed_torch_version(python_package_dirs(venv.path() / "bin/python", {}))->text,
            "2.13.0+cpu");
}

TEST(TorchVersion, AMetadataFolderStandsInForVersionPy) {
  FakeInstall install;
  std::filesystem::create_directories(install.site() / "torch");
  std::filesystem::create_directories(install.site() / "torch-2.1.0.dist-info");
  EXPECT_EQ(installed_torch_version(python_package_dirs(install.python(), {}))->text, "2.1.0");
}

TEST(TorchVersion, TheMachinesOwnTorchesAreFound) {
  // Debian's python3-torch 1.13 and the repository's venv with torch 2.13, as installed.
  if (std::filesystem::exists("/usr/lib/python3/dist-packages/torch/version.py")) {
    auto debian = installed_torch_version(python_package_dirs("/usr/bin/python3", {}));
    ASSERT_TRUE(debian);
    EXPECT_EQ(debian->major, 1);
  }
  const std::filesystem::path venv = std::filesystem::path(MCPRUN_SOURCE_DIR) / ".venv/bin/python";
  if (std::filesystem::exists(venv)) {
    auto torch2 = installed_torch_version(python_package_dirs(venv, {}));
    ASSERT_TRUE(torch2);
    EXPECT_EQ(torch2->major, 2);
  }
}

}  // namespace
}  // namespace mcprun
