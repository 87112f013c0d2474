// NVML is loaded at run time, never linked: mcprun must start on machines without a driver. Only
// what nothing cheaper tells (which processes hold a GPU's memory) is asked of it, and never on a
// launch: loading and initialising it costs ~9 ms and ~18 MB of resident memory.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "common/topology.hpp"

namespace mcprun {
namespace {

using nvmlDevice_t = void*;
/// nvml.h's nvmlPciInfo_t, as the _v2/_v3 calls fill it.
struct NvmlPciInfo {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};
/// nvml.h's nvmlProcessInfo_t (nvmlProcessInfo_v2_t), as the _v2/_v3 process lists fill it.
struct NvmlProcessInfo {
  unsigned pid;
  unsigned long long used_gpu_memory;
  unsigned gpu_instance_id, compute_instance_id;
};
constexpr int kNvmlInsufficientSize = 7;
constexpr unsigned long long kNvmlValueNotAvailable = ~0ULL;

/// The bus id NVML reports, from the text field when filled, else from the numeric fields.
std::string bus_id_of(const NvmlPciInfo& info) {
  const std::string_view text(info.bus_id, strnlen(info.bus_id, sizeof info.bus_id));
  if (!text.empty()) return normalise_bus_id(text);
  char out[48];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.0", info.domain, info.bus, info.device);
  return out;
}

}  // namespace

std::optional<std::vector<GpuProcess>> nvml_processes_on(const std::string& bus_id) {
  void* library = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!library) return std::nullopt;
  using InitFn = int (*)();
  using CountFn = int (*)(unsigned*);
  using HandleFn = int (*)(unsigned, nvmlDevice_t*);
  using PciFn = int (*)(nvmlDevice_t, NvmlPciInfo*);
  using ProcessesFn = int (*)(nvmlDevice_t, unsigned*, NvmlProcessInfo*);
  auto init = reinterpret_cast<InitFn>(::dlsym(library, "nvmlInit_v2"));
  auto count = reinterpret_cast<CountFn>(::dlsym(library, "nvmlDeviceGetCount_v2"));
  auto handle = reinterpret_cast<HandleFn>(::dlsym(library, "nvmlDeviceGetHandleByIndex_v2"));
  auto pci = reinterpret_cast<PciFn>(::dlsym(library, "nvmlDeviceGetPciInfo_v3"));
  if (!pci) pci = reinterpret_cast<PciFn>(::dlsym(library, "nvmlDeviceGetPciInfo_v2"));
  auto processes =
      reinterpret_cast<ProcessesFn>(::dlsym(library, "nvmlDeviceGetComputeRunningProcesses_v3"));
  if (!processes)
    processes =
        reinterpret_cast<ProcessesFn>(::dlsym(library, "nvmlDeviceGetComputeRunningProcesses_v2"));
  auto shutdown = reinterpret_cast<InitFn>(::dlsym(library, "nvmlShutdown"));
  std::optional<std::vector<GpuProcess>> found;
  unsigned devices = 0;
  if (init && count && handle && pci && processes && init() == 0) {
    const std::string wanted = normalise_bus_id(bus_id);
    for (unsigned i = 0; count(&devices) == 0 && i < devices && !found; ++i) {
      nvmlDevice_t device = nullptr;
      NvmlPciInfo info{};
      if (handle(i, &device) != 0 || pci(device, &info) != 0 || bus_id_of(info) != wanted) continue;
      std::vector<NvmlProcessInfo> infos(64);
      unsigned listed = static_cast<unsigned>(infos.size());
      int status = processes(device, &listed, infos.data());
      if (status == kNvmlInsufficientSize) {  // More processes than room: `listed` says how many.
        infos.resize(listed + 16);
        listed = static_cast<unsigned>(infos.size());
        status = processes(device, &listed, infos.data());
      }
      if (status != 0) break;
      found.emplace();
      for (unsigned p = 0; p < listed && p < infos.size(); ++p)
        found->push_back(
            {static_cast<int>(infos[p].pid),
             infos[p].used_gpu_memory == kNvmlValueNotAvailable ? 0 : infos[p].used_gpu_memory});
    }
    if (shutdown) shutdown();
  }
  ::dlclose(library);
  return found;
}

}  // namespace mcprun
