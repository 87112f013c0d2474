// NVML is loaded at run time, never linked: mcprun must start on machines without a driver.
#include <dlfcn.h>

#include <algorithm>
#include <cctype>
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

/// "00000000:3B:00.0" (NVML) or "0000:3b:00.0" (sysfs) -> "0000:3b:00.0": one spelling to compare.
std::string normalise_bus_id(std::string_view text) {
  unsigned long domain = 0;
  unsigned bus = 0, device = 0, function = 0;
  std::string copy(text);
  if (std::sscanf(copy.c_str(), "%lx:%x:%x.%x", &domain, &bus, &device, &function) != 4) {
    for (char& c : copy) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return copy;
  }
  char out[48];
  std::snprintf(out, sizeof out, "%04lx:%02x:%02x.%x", domain, bus, device, function);
  return out;
}

/// The bus id NVML reports, from the text field when filled, else from the numeric fields.
std::string bus_id_of(const NvmlPciInfo& info) {
  const std::string_view text(info.bus_id, strnlen(info.bus_id, sizeof info.bus_id));
  if (!text.empty()) return normalise_bus_id(text);
  char out[48];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.0", info.domain, info.bus, info.device);
  return out;
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
        char text[96] = {};  // NVML_DEVICE_UUID_V2_BUFFER_SIZE.
        if (handle(i, &device) != 0 || pci(device, &info) != 0 ||
            uuid(device, text, sizeof text) != 0)
          continue;
        text[sizeof text - 1] = '\0';
        const std::string bus_id = bus_id_of(info);
        for (GpuDevice& gpu : gpus)
          if (normalise_bus_id(gpu.bus_id) == bus_id) gpu.uuid = text;
      }
    }
    if (shutdown) shutdown();
  }
  ::dlclose(library);
}

}  // namespace mcprun
