#include "launcher/diagnose/failure_hints.hpp"

#include <gtest/gtest.h>

namespace mcprun {
namespace {

using Lines = std::vector<std::string>;

/// One node with two GPUs (the H200 box's bus id first) and two ranks.
HintJob two_gpu_job(bool pinned) {
  HintJob job;
  GpuDevice first, second;
  first.bus_id = "0000:00:06.0";
  first.uuid = "GPU-c94f22be-4c83-5fa0-46a4-3db114166912";
  second.bus_id = "0000:3b:00.0";
  second.pci_index = 1;
  job.node_gpus = {first, second};
  job.pinned = pinned;
  job.no_pin = !pinned;
  job.master_port = 29500;
  for (int rank : {0, 1}) {
    job.ranks[rank].local_rank = rank;
    job.ranks[rank].pid = 1000 + rank;
    if (pinned) job.ranks[rank].visible_gpus = {first.uuid, "1"};
  }
  return job;
}

/// Probes that answer from fixed values and record what was asked.
struct FakeProbes {
  HintProbes probes;
  std::vector<std::string> nvml_asked;
  FakeProbes() {
    probes.shm_space = [] { return FileSystemSpace{3u << 20, 64u << 20}; };
    probes.gpu_processes = [this](const std::string& bus_id) {
      nvml_asked.push_back(bus_id);
      return std::optional<std::vector<GpuProcess>>({{1000, 518ull << 20}, {4242, 80ull << 30}});
    };
    probes.port_listener = [](int) { return std::optional<PortListener>(); };
    probes.command_of = [](int pid) {
      return pid == 4242 ? std::string("python3") : std::string();
    };
    probes.own_pid = 777;
  }
};

std::string hint(int rank, const Lines& lines, const HintJob& job, const HintProbes& probes) {
  return failure_hint(rank, lines, job, probes).value_or("<none>");
}

// NCCL 2.28.9 under torch 2.11 on the H200 box, two ranks with --no-pin (verbatim).
const Lines kDuplicateGpu = {
    "torch.distributed.DistBackendError: NCCL error in: "
    "/pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage (run with "
    "NCCL_DEBUG=WARN for details), NCCL version 2.28.9",
    "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
    "Last error:", "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 60"};

TEST(FailureHints, DuplicateGpuUnderNoPinNamesRanksGpuAndCause) {
  FakeProbes fake;
  const std::string text = hint(1, kDuplicateGpu, two_gpu_job(false), fake.probes);
  EXPECT_NE(text.find("ranks 1 and 0"), std::string::npos) << text;
  EXPECT_NE(text.find("0000:00:06.0 (GPU-c94f22be-4c83-5fa0-46a4-3db114166912)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("--no-pin"), std::string::npos) << text;
  EXPECT_TRUE(fake.nvml_asked.empty());
}

TEST(FailureHints, DuplicateGpuNamesAnInheritedCudaVisibleDevices) {
  FakeProbes fake;
  HintJob job = two_gpu_job(false);
  job.inherited_visible_devices = "0";
  const std::string text = hint(0, kDuplicateGpu, job, fake.probes);
  EXPECT_NE(text.find("inherited CUDA_VISIBLE_DEVICES=0"), std::string::npos) << text;
}

TEST(FailureHints, DuplicateGpuWhilePinnedPointsAtTheScriptsDeviceChoice) {
  FakeProbes fake;
  const std::string text = hint(0, kDuplicateGpu, two_gpu_job(true), fake.probes);
  EXPECT_NE(text.find("cuda:1 and cuda:0"), std::string::npos) << text;
  EXPECT_NE(text.find("LOCAL_RANK"), std::string::npos) << text;
  EXPECT_EQ(text.find("--no-pin"), std::string::npos) << text;
}

TEST(FailureHints, InvalidDeviceOrdinalNamesLocalRankAndTheGpusItSaw) {
  FakeProbes fake;
  HintJob job = two_gpu_job(false);
  job.inherited_visible_devices = "GPU-c94f22be-4c83-5fa0-46a4-3db114166912";
  // torch 2.11, CUDA 13, torch.cuda.set_device(1) with one GPU visible (verbatim).
  const Lines torch2 = {"torch.AcceleratorError: CUDA error: invalid device ordinal",
                        "GPU device may be out of range, do you have enough GPUs?"};
  const std::string text = hint(1, torch2, job, fake.probes);
  EXPECT_NE(text.find("rank 1 has LOCAL_RANK=1 but could see 1 GPU(s)"), std::string::npos) << text;
  // torch 1.13 raises it as a RuntimeError with the same CUDA text.
  const Lines torch1 = {"RuntimeError: CUDA error: invalid device ordinal",
                        "CUDA kernel errors might be asynchronously reported at some other API "
                        "call,so the stacktrace below might be incorrect."};
  EXPECT_NE(hint(1, torch1, two_gpu_job(true), fake.probes).find("could see 2 GPU(s)"),
            std::string::npos);
  // No GPU found on the node (a container without them in sysfs): no count is claimed.
  HintJob blind = two_gpu_job(false);
  blind.node_gpus.clear();
  const std::string unknown = hint(1, torch1, blind, fake.probes);
  EXPECT_NE(unknown.find("found no NVIDIA GPU"), std::string::npos) << unknown;
  EXPECT_EQ(unknown.find("could see"), std::string::npos) << unknown;
}

TEST(FailureHints, SharedMemoryGivesTheFreeSizeAndTheRemedy) {
  FakeProbes fake;
  // NCCL >= 2.19 shmutils.cc, and the "Last error" torch quotes from older NCCL.
  const Lines extend = {
      "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
      "device error. ",
      "Last error:",
      "Error: failed to extend /dev/shm/nccl-8Qz1Ae to 9637892 bytes, error: No space left on "
      "device (28)"};
  std::string text = hint(0, extend, two_gpu_job(true), fake.probes);
  EXPECT_NE(text.find("/dev/shm/nccl-8Qz1Ae of 9637892 bytes"), std::string::npos) << text;
  EXPECT_NE(text.find("/dev/shm has 3 MiB free of 64 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("--shm-size"), std::string::npos) << text;
  EXPECT_NE(text.find("NCCL_SHM_DISABLE=1"), std::string::npos) << text;
  const Lines create = {
      "Error while creating shared memory segment /dev/shm/nccl-vzIpS6 (size 9637888)"};
  EXPECT_NE(hint(0, create, two_gpu_job(true), fake.probes).find("of 9637888 bytes"),
            std::string::npos);
  const Lines attach = {
      "Error while attaching to shared memory segment /dev/shm/nccl-Xb3n9W (size 0), error: No "
      "such file or directory (2)"};
  text = hint(0, attach, two_gpu_job(true), fake.probes);
  EXPECT_NE(text.find("attach to a peer's shared-memory segment /dev/shm/nccl-Xb3n9W"),
            std::string::npos)
      << text;
}

TEST(FailureHints, SocketBootstrapNamesTheInterfaceAndPointsToDoctor) {
  FakeProbes fake;
  HintJob job = two_gpu_job(true);
  job.socket_interface = "eth0";
  const Lines no_interface = {
      "gpu-1:223645:223645 [0] bootstrap.cc:45 NCCL WARN Bootstrap : no socket interface found"};
  std::string text = hint(0, no_interface, job, fake.probes);
  EXPECT_NE(text.find("NCCL_SOCKET_IFNAME=eth0"), std::string::npos) << text;
  EXPECT_NE(text.find("mcprun doctor"), std::string::npos) << text;
  // NCCL's own pick, from its INFO line, when nothing set the variable.
  const Lines refused = {"gpu-1:4242:4242 [0] NCCL INFO Bootstrap : Using ens5:10.0.3.17<0>",
                         "gpu-1:4242:4290 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: "
                         "Connect to 10.0.3.9<52315> failed : Software caused connection abort"};
  text = hint(0, refused, two_gpu_job(true), fake.probes);
  EXPECT_NE(text.find("NCCL chose ens5 itself"), std::string::npos) << text;
}

TEST(FailureHints, OutOfMemoryNamesTheGpuAndTheOtherProcessesOnIt) {
  FakeProbes fake;
  // torch 2.11 on the H200 box (verbatim, to the "...").
  const Lines torch2 = {
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 400.00 GiB. GPU 0 has a total "
      "capacity of 139.80 GiB of which 139.29 GiB is free. Including non-PyTorch memory, this "
      "process has 518.00 MiB memory in use. ..."};
  const std::string text = hint(0, torch2, two_gpu_job(true), fake.probes);
  EXPECT_NE(text.find("its cuda:0, GPU 0000:00:06.0 (GPU-c94f22be-4c83-5fa0-46a4-3db114166912), "
                      "asking for 400.00 GiB"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("pid 4242 (python3), 80 GiB"), std::string::npos) << text;
  EXPECT_EQ(text.find("pid 1000"), std::string::npos)
      << text;  // The job's own rank is no stranger.
  EXPECT_EQ(fake.nvml_asked, (Lines{"0000:00:06.0"}));
  // torch 1.13's wording, on the rank's cuda:1 (the second GPU it sees).
  const Lines torch1 = {
      "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 1; 15.78 GiB total "
      "capacity; 14.21 GiB already allocated; 3.50 MiB free; 14.73 GiB reserved in total by "
      "PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid "
      "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"};
  EXPECT_NE(hint(1, torch1, two_gpu_job(true), fake.probes)
                .find("its cuda:1, GPU 0000:3b:00.0, asking for 20.00 MiB"),
            std::string::npos);
}

TEST(FailureHints, OutOfMemoryWithoutNvmlSaysSo) {
  FakeProbes fake;
  fake.probes.gpu_processes = [](const std::string&) {
    return std::optional<std::vector<GpuProcess>>();
  };
  const Lines oom = {
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 400.00 GiB. GPU 0 has a total "
      "capacity of 139.80 GiB of which 139.29 GiB is free."};
  EXPECT_NE(hint(0, oom, two_gpu_job(true), fake.probes).find("NVML is not available"),
            std::string::npos);
  // Only the job's own rank on it: nobody else to blame.
  fake.probes.gpu_processes = [](const std::string&) {
    return std::optional<std::vector<GpuProcess>>({{1000, 518ull << 20}});
  };
  EXPECT_NE(hint(0, oom, two_gpu_job(true), fake.probes).find("NVML lists no other process"),
            std::string::npos);
}

// A TCPStore server on a taken port, as this machine's torch 1.13 raises it.
const Lines kPortInUse = {
    "RuntimeError: The server socket has failed to listen on any local network address. The server "
    "socket has failed to bind to [::]:29500 (errno: 98 - Address already in use). The server "
    "socket has failed to bind to 0.0.0.0:29500 (errno: 98 - Address already in use)."};
// The same under torch 2.13 (its libuv store).
const Lines kPortInUseTorch2 = {
    "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
    "network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address "
    "already in use"};

TEST(FailureHints, MasterPortInUseNamesWhoHoldsIt) {
  FakeProbes fake;
  fake.probes.port_listener = [](int port) {
    return port == 29500 ? std::optional<PortListener>(PortListener{4242, "python3"})
                         : std::nullopt;
  };
  std::string text = hint(0, kPortInUse, two_gpu_job(true), fake.probes);
  EXPECT_NE(text.find("MASTER_PORT 29500 is held by pid 4242 (python3)"), std::string::npos)
      << text;
  EXPECT_EQ(hint(0, kPortInUseTorch2, two_gpu_job(true), fake.probes), text);
  fake.probes.port_listener = [](int) {
    return std::optional<PortListener>(PortListener{777, "mcprun"});
  };
  text = hint(0, kPortInUse, two_gpu_job(true), fake.probes);
  EXPECT_NE(text.find("mcprun serves the job's store"), std::string::npos) << text;
}

// gloo under torch 1.13 (verbatim), rank 0 after rank 1 left the loop and exited.
const Lines kGlooPeerClosed = {
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer "
    "[127.0.0.1]:17581"};
const Lines kNcclRemoteError = {
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, remote process "
    "exited or there was a network error, NCCL version 2.27.3",
    "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
    "prematurely."};

HintJob job_where_rank_1_finished(double seconds_before) {
  HintJob job = two_gpu_job(true);
  job.failed_at = std::chrono::system_clock::now();
  job.finished_at[1] =
      job.failed_at - std::chrono::milliseconds(static_cast<int>(seconds_before * 1000));
  job.finished_at[2] = job.failed_at - std::chrono::seconds(300);  // Long before: not this.
  return job;
}

TEST(FailureHints, APeerLostJustAfterAnotherRankFinishedNamesTheFinisher) {
  FakeProbes fake;
  for (const Lines& lines : {kGlooPeerClosed, kNcclRemoteError}) {
    const HintJob job = job_where_rank_1_finished(0.1);
    EXPECT_EQ(hint(0, lines, job, fake.probes).substr(0, 60),
              "rank 1 finished (exit 0) 0.1 s before rank 0 lost its peer: ");
    const auto finisher = early_finisher(0, lines, job);
    ASSERT_TRUE(finisher);
    EXPECT_EQ(finisher->rank, 1);
    EXPECT_NEAR(finisher->seconds_before, 0.1, 0.01);
  }
}

TEST(FailureHints, APeerLostWithNoRankFinishedShortlyBeforeKeepsTheRootCause) {
  FakeProbes fake;
  const HintJob job = job_where_rank_1_finished(kEarlyFinisherWindow.count() + 5.0);
  EXPECT_FALSE(early_finisher(0, kGlooPeerClosed, job));
  EXPECT_NE(
      hint(0, kGlooPeerClosed, job, fake.probes).find("rank 0 lost the connection to a peer rank"),
      std::string::npos);
  // A rank that finished after the failure is not its cause; nor is any for another error.
  HintJob later = job_where_rank_1_finished(-1.0);
  EXPECT_FALSE(early_finisher(0, kGlooPeerClosed, later));
  EXPECT_FALSE(early_finisher(0, {"ValueError: bad shard 17"}, job_where_rank_1_finished(0.1)));
}

TEST(FailureHints, ALineThatMatchesNothingGetsNoHint) {
  FakeProbes fake;
  const Lines unrelated = {"ValueError: bad shard 17", "CUDA out of memory",
                           "Duplicate GPU detected", "Address already in use"};
  EXPECT_FALSE(failure_hint(0, unrelated, two_gpu_job(true), fake.probes));
  EXPECT_FALSE(failure_hint(0, {}, two_gpu_job(true), fake.probes));
  EXPECT_TRUE(fake.nvml_asked.empty());
}

}  // namespace
}  // namespace mcprun
