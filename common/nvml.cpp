// NVML is loaded at run time, never linked: mcprun must start on machines without a driver.
#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdio>

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

/// "00000000:3B:00.0" (NVML) -> "0000:3b:00.0" (sysfs).
std::string normalise_bus_id(const NvmlPciInfo& info) {
  char text[32];
  std::snprintf(text, sizeof text, "%04x:%02x:%02x.0", info.domain & 0xffff, info.bus, info.device);
  return text;
}

}  // namespace

void annotate_with_nvml(std::vector<GpuDevice>& gpus) {
  if (gpus.empty()) return;
  void* library = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!library) return;
  using InitFn = int (*)();
  using CountFn = int (*)(unsigned*);
  using HandleFn = int (*)(unsigned, nvmlDevice_t*);
  using PciFn = int (*)(nvmlDevice_t, NvmlPciInfo*);
  using UuidFn = int (*)(nvmlDevice_t, char*, unsigned);
  auto init = reinterpret_cast<InitFn>(::dlsym(library, "nvmlInit_v2"));
  auto count = reinterpret_cast<CountFn>(::dlsym(library, "nvmlDeviceGetCount_v2"));
  auto handle = reinterpret_cast<HandleFn>(::dlsym(library, "nvmlDeviceGetHandleByIndex_v2"));
  auto pci = reinterpret_cast<PciFn>(::dlsym(library, "nvmlDeviceGetPciInfo_v3"));
  if (!pci) pci = reinterpret_cast<PciFn>(::dlsym(library, "nvmlDeviceGetPciInfo_v2"));
  auto uuid = reinterpret_cast<UuidFn>(::dlsym(library, "nvmlDeviceGetUUID"));
  auto shutdown = reinterpret_cast<InitFn>(::dlsym(library, "nvmlShutdown"));
  unsigned devices = 0;
  if (init && count && handle && pci && uuid && init() == 0) {
    if (count(&devices) == 0) {
      for (unsigned i = 0; i < devices; ++i) {
        nvmlDevice_t device = nullptr;
        NvmlPciInfo info{};
        char text[96] = {};
        if (handle(i, &device) != 0 || pci(device, &info) != 0 ||
            uuid(device, text, sizeof text) != 0)
          continue;
        const std::string bus_id = normalise_bus_id(info);
        for (GpuDevice& gpu : gpus)
          if (gpu.bus_id == bus_id) gpu.uuid = text;
      }
    }
    if (shutdown) shutdown();
  }
  ::dlclose(library);
}

}  // namespace mcprun
