#include "launcher/diagnose/failure_hints.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdlib>
#include <regex>
#include <sstream>

#include "common/sys.hpp"

namespace mcprun {
namespace {

/// What an explanation may use: the rank, all of its lines, the job and the system.
struct HintInput {
  int rank;
  const std::vector<std::string>& lines;
  const HintJob& job;
  const HintProbes& probes;
};

using Explain = std::string (*)(const std::smatch& match, const HintInput& input);

/// One recognised failure: the text torch, CUDA or NCCL prints, and what it means for the job.
struct Signature {
  const char* name;
  std::regex pattern;
  Explain explain;
};

std::string describe(const GpuDevice& gpu) {
  return gpu.uuid.empty() ? gpu.bus_id : gpu.bus_id + " (" + gpu.uuid + ")";
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (item.find_first_not_of(' ') != std::string::npos) items.push_back(item);
  return items;
}

const HintRank* rank_of(const HintInput& input, int rank) {
  auto found = input.job.ranks.find(rank);
  return found == input.job.ranks.end() ? nullptr : &found->second;
}

/// The CUDA_VISIBLE_DEVICES entries a rank saw; nullopt when it saw every GPU of the node.
std::optional<std::vector<std::string>> visible_to(const HintInput& input, int rank) {
  if (const HintRank* hint_rank = rank_of(input, rank);
      hint_rank && !hint_rank->visible_gpus.empty())
    return hint_rank->visible_gpus;
  if (input.job.inherited_visible_devices) return split_list(*input.job.inherited_visible_devices);
  return std::nullopt;
}

/// The GPU a rank calls cuda:<index>; nullopt when that cannot be told for sure (an unpinned rank
/// on a node of several GPUs numbers them in CUDA's own order).
std::optional<GpuDevice> gpu_at(const HintInput& input, int rank, size_t index) {
  const auto visible = visible_to(input, rank);
  if (visible) {
    if (index >= visible->size()) return std::nullopt;
    auto order = topology_order(input.job.node_gpus, (*visible)[index]);
    if (order.gpus.size() == 1) return order.gpus.front();
    return std::nullopt;
  }
  if (input.job.node_gpus.size() == 1 && index == 0) return input.job.node_gpus.front();
  return std::nullopt;
}

/// Why two ranks could share a GPU in this job.
std::string why_shared(const HintInput& input, int first, int second) {
  const HintRank* a = rank_of(input, first);
  const HintRank* b = rank_of(input, second);
  if (input.job.pinned) {
    const std::string given =
        a && b ? fmt::format("mcprun gave them cuda:{} and cuda:{}", a->local_rank, b->local_rank)
               : "mcprun gave each rank its own GPU as cuda:LOCAL_RANK";
    return given +
           ", so the script picks its device without LOCAL_RANK: call "
           "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))";
  }
  const std::string cause = input.job.no_pin
                                ? "--no-pin left every rank the same GPUs"
                                : "mcprun pinned no GPU (none found to pin, or -n cpu)";
  if (input.job.inherited_visible_devices)
    return cause + ", and every rank inherited CUDA_VISIBLE_DEVICES=" +
           *input.job.inherited_visible_devices + "; NCCL needs one GPU per rank";
  return cause + "; NCCL needs one GPU per rank: drop --no-pin, or give each rank its own device";
}

std::string duplicate_gpu(const std::smatch& match, const HintInput& input) {
  const int first = std::stoi(match[1].str()), second = std::stoi(match[2].str());
  // NCCL prints the bus id as one hex number: "0000:00:06.0" is 0x60.
  const unsigned long long device = std::strtoull(match[3].str().c_str(), nullptr, 16);
  std::string gpu = "CUDA device " + match[3].str();
  for (const GpuDevice& candidate : input.job.node_gpus) {
    std::string digits;
    for (char c : candidate.bus_id)
      if (std::isxdigit(static_cast<unsigned char>(c))) digits += c;
    if (!digits.empty() && std::strtoull(digits.c_str(), nullptr, 16) == device)
      gpu = describe(candidate);
  }
  return fmt::format("ranks {} and {} both ran on GPU {}: {}", first, second, gpu,
                     why_shared(input, first, second));
}

std::string invalid_ordinal(const std::smatch&, const HintInput& input) {
  const HintRank* rank = rank_of(input, input.rank);
  const auto visible = visible_to(input, input.rank);
  const size_t count = visible ? visible->size() : input.job.node_gpus.size();
  std::string seen = visible ? "CUDA_VISIBLE_DEVICES=" + fmt::format("{}", fmt::join(*visible, ","))
                             : "every GPU of the node";
  std::string local = rank ? "LOCAL_RANK=" + std::to_string(rank->local_rank) : "its LOCAL_RANK";
  if (!visible && input.job.node_gpus.empty())  // What it saw is unknown: say only what is.
    return fmt::format(
        "rank {} has {}, and mcprun found no NVIDIA GPU on this node to pin: a device "
        "index must be below the number of GPUs the rank sees; index by LOCAL_RANK, "
        "not RANK",
        input.rank, local);
  return fmt::format(
      "rank {} has {} but could see {} GPU(s) ({}): a device index must be below "
      "{}; index by LOCAL_RANK, not RANK, and run at most {} rank(s) per node",
      input.rank, local, count, seen, count, count);
}

std::string shared_memory(const std::smatch& match, const HintInput& input) {
  const std::string bytes = match[3].matched ? match[3].str() : match[4].str();
  const auto space = input.probes.shm_space ? input.probes.shm_space() : std::nullopt;
  const std::string free = space ? fmt::format("/dev/shm has {} free of {}",
                                               human_bytes(static_cast<double>(space->free)),
                                               human_bytes(static_cast<double>(space->total)))
                                 : "/dev/shm could not be read";
  const std::string remedy =
      "give /dev/shm more room (docker run --shm-size=8g; docker's default "
      "is 64 MB), or set NCCL_SHM_DISABLE=1 at a cost in speed";
  if (match[1].str().find("attaching") != std::string::npos)
    return fmt::format(
        "NCCL could not attach to a peer's shared-memory segment {} ({}): the peer "
        "could not create it, or the ranks of this node do not share one /dev/shm "
        "(separate containers); {}",
        match[2].str(), free, remedy);
  return fmt::format("NCCL could not make its shared-memory segment {}{} ({}): {}", match[2].str(),
                     bytes.empty() || bytes == "0" ? "" : " of " + bytes + " bytes", free, remedy);
}

std::string socket_bootstrap(const std::smatch&, const HintInput& input) {
  // NCCL names the interface it took in an INFO line: "NCCL INFO Bootstrap : Using
  // eth0:10.0.0.1<0>".
  static const std::regex kUsing(R"(Bootstrap : Using ([^:\s]+):)");
  std::string chosen;
  for (const std::string& line : input.lines) {
    std::smatch used;
    if (std::regex_search(line, used, kUsing)) chosen = used[1].str();
  }
  std::string where;
  if (!input.job.socket_interface.empty())
    where = "NCCL_SOCKET_IFNAME=" + input.job.socket_interface;
  else if (!chosen.empty())
    where = "NCCL chose " + chosen + " itself (NCCL_SOCKET_IFNAME unset)";
  else
    where = "NCCL_SOCKET_IFNAME unset, so NCCL chose an interface itself";
  return "NCCL's bootstrap could not open or reach its peers' sockets at init (" + where +
         "): run `mcprun doctor` on each node to see which interface reaches the others";
}

std::string out_of_memory(const std::smatch& match, const HintInput& input) {
  const size_t index = std::stoul(match[2].str());
  const auto gpu = gpu_at(input, input.rank, index);
  std::string text = fmt::format("rank {} ran out of memory on its cuda:{}", input.rank, index);
  if (!gpu) return text + fmt::format(", asking for {}", match[1].str());
  text += fmt::format(", GPU {}, asking for {}", describe(*gpu), match[1].str());
  const auto processes =
      input.probes.gpu_processes ? input.probes.gpu_processes(gpu->bus_id) : std::nullopt;
  if (!processes) return text + "; NVML is not available to list what else holds memory on it";
  std::vector<std::string> others;
  for (const GpuProcess& process : *processes) {
    bool ours = false;
    for (const auto& [rank, hint_rank] : input.job.ranks) ours |= hint_rank.pid == process.pid;
    if (ours) continue;
    std::string command = input.probes.command_of ? input.probes.command_of(process.pid) : "";
    others.push_back(fmt::format(
        "pid {}{}{}", process.pid, command.empty() ? "" : " (" + command + ")",
        process.used_bytes ? ", " + human_bytes(static_cast<double>(process.used_bytes)) : ""));
  }
  if (others.empty())
    return text +
           "; NVML lists no other process holding memory on it: the rank alone asks for "
           "more than it has";
  return text + "; other processes hold memory on it (NVML), another job on a shared GPU: " +
         fmt::format("{}", fmt::join(others, "; "));
}

std::string master_port_taken(const std::smatch& match, const HintInput& input) {
  const int port = std::stoi(match[1].matched ? match[1].str() : match[2].str());
  const auto listener =
      input.probes.port_listener ? input.probes.port_listener(port) : std::nullopt;
  const std::string which = port == input.job.master_port ? "MASTER_PORT " : "port ";
  if (listener && listener->pid && *listener->pid == input.probes.own_pid)
    return fmt::format(
        "{}{} is where mcprun serves the job's store, as torchrun's agent does: the "
        "script starts a second store there; use init_method='env://' (the "
        "default), not tcp://...:{} or TCPStore(is_master=True) on that port",
        which, port, port);
  if (listener && listener->pid)
    return fmt::format(
        "{}{} is held by pid {} ({}): another job on this node? Omit --master-port "
        "and mcprun picks a free one",
        which, port, *listener->pid, listener->command);
  if (listener)
    return fmt::format(
        "{}{} is held by a process of another user: omit --master-port and mcprun "
        "picks a free one",
        which, port);
  return fmt::format(
      "{}{} was taken when the rank bound it (free now): another job on this node "
      "may have held it; omit --master-port and mcprun picks a free one",
      which, port);
}

/// A peer's connection lost: gloo's transport ("Connection closed by peer [10.0.0.2]:2345",
/// "Connection reset by peer"), NCCL's ncclRemoteError ("remote process exited or there was a
/// network error", "... a network error or a remote process exiting prematurely") and its
/// socket layer's "Connection closed by remote peer".
const std::regex& peer_lost_pattern() {
  static const std::regex pattern(
      R"(Connection closed by peer|Connection reset by peer|remote process exited or there was a network error|remote process exiting prematurely|Connection closed by remote peer)");
  return pattern;
}

std::optional<EarlyFinisher> finished_before(int rank, const HintJob& job) {
  std::optional<EarlyFinisher> latest;
  for (const auto* finishers : {&job.finished_at, &job.exiting_at})
    for (const auto& [finished, at] : *finishers) {
      const double before = std::chrono::duration<double>(job.failed_at - at).count();
      if (finished == rank || before < 0 || before > kEarlyFinisherWindow.count()) continue;
      if (!latest || before < latest->seconds_before)
        latest = EarlyFinisher{finished, before, finishers == &job.finished_at};
    }
  return latest;
}

std::string peer_lost(const std::smatch&, const HintInput& input) {
  if (auto finisher = finished_before(input.rank, input.job))
    return fmt::format(
        "rank {} finished {} {:.1f} s before rank {} lost its peer: uneven "
        "data across ranks? Every rank must run the same collectives: give each "
        "the same number of batches (DistributedSampler(drop_last=True)) or use "
        "DDP's join()",
        finisher->rank,
        finisher->exit_code_known ? "(exit 0)" : "(its script ended; its interpreter was exiting)",
        finisher->seconds_before, input.rank);
  return fmt::format(
      "rank {} lost the connection to a peer rank: that peer ended or was cut off "
      "first, so its end (another rank's exit, or another node) is the cause",
      input.rank);
}

/// Every recognised failure, checked in this order against each line; the text is as torch, CUDA
/// and NCCL print it.
const std::vector<Signature>& signatures() {
  static const std::vector<Signature> table = {
      // NCCL init.cc: WARN("Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx").
      {"nccl-duplicate-gpu",
       std::regex(
           R"(Duplicate GPU detected : rank (\d+) and rank (\d+) both on CUDA device ([0-9a-fA-F]+))"),
       duplicate_gpu},
      // CUDA's cudaErrorInvalidDevice, as torch raises it: "CUDA error: invalid device ordinal".
      {"cuda-invalid-device-ordinal", std::regex(R"(CUDA error: invalid device ordinal)"),
       invalid_ordinal},
      // NCCL shmutils.cc: "Error: failed to extend %s to %ld bytes", and before 2.19 "Error while
      // creating shared memory segment %s (size %d)" / "Error while attaching to ...".
      {"nccl-shared-memory",
       std::regex(
           R"((Error: failed to extend|Error while creating shared memory segment|Error while attaching to shared memory segment) ([^\s,]+)(?: to (\d+) bytes| \(size (\d+)\))?)"),
       shared_memory},
      // NCCL bootstrap.cc / net_socket.cc / socket.cc at init.
      {"nccl-socket-bootstrap",
       std::regex(
           R"(Bootstrap : no socket interface found|NET/Socket : no interface found|socketStartConnect: Connect to \S+ failed : )"),
       socket_bootstrap},
      // torch 2.x "CUDA out of memory. Tried to allocate 400.00 GiB. GPU 0 has a total capacity
      // ..."; torch 1.13 "... Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; ...".
      {"cuda-out-of-memory",
       std::regex(R"(CUDA out of memory\. Tried to allocate (\S+ \S+?)[.( ]+GPU (\d+))"),
       out_of_memory},
      // A TCPStore server on a taken port. torch 1.13's c10d socket.cpp: "The server socket has
      // failed to bind to [::]:29500 (errno: 98 - Address already in use)."; torch 2.x's libuv
      // one: "... failed to listen on any local network address. port: 29500, useIpv6: false,
      // code: -98, name: EADDRINUSE, message: address already in use".
      {"master-port-in-use",
       std::regex(
           R"(The server socket has failed to bind to \S*:(\d+) \(errno: 98 - Address already in use\)|The server socket has failed to listen on any local network address\. port: (\d+), useIpv6: \w+, code: -98, name: EADDRINUSE)"),
       master_port_taken},
      {"peer-lost", peer_lost_pattern(), peer_lost},
  };
  return table;
}

std::optional<FileSystemSpace> statvfs_space(const char* path) {
  struct statvfs info {};
  if (::statvfs(path, &info) != 0) return std::nullopt;
  return FileSystemSpace{static_cast<std::uintmax_t>(info.f_bavail) * info.f_frsize,
                         static_cast<std::uintmax_t>(info.f_blocks) * info.f_frsize};
}

}  // namespace

HintProbes system_hint_probes() {
  HintProbes probes;
  probes.shm_space = [] { return statvfs_space("/dev/shm"); };
  probes.gpu_processes = nvml_processes_on;
  probes.port_listener = listener_on_port;
  probes.command_of = [](int pid) {
    return read_attribute(std::filesystem::path("/proc") / std::to_string(pid) / "comm");
  };
  probes.own_pid = static_cast<int>(::getpid());
  return probes;
}

std::optional<std::string> failure_hint(int rank, const std::vector<std::string>& lines,
                                        const HintJob& job, const HintProbes& probes) {
  const HintInput input{rank, lines, job, probes};
  for (const Signature& signature : signatures())
    for (const std::string& line : lines) {
      std::smatch match;
      if (std::regex_search(line, match, signature.pattern)) return signature.explain(match, input);
    }
  return std::nullopt;
}

std::optional<EarlyFinisher> early_finisher(int rank, const std::vector<std::string>& lines,
                                            const HintJob& job) {
  for (const std::string& line : lines)
    if (std::regex_search(line, peer_lost_pattern())) return finished_before(rank, job);
  return std::nullopt;
}

}  // namespace mcprun
