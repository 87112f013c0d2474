// Builds fake sysfs trees for topology tests, mirroring the real layout: bus/pci/devices/<bdf> is a
// relative symlink into devices/pci<domain>:00/[<switch>/]<bdf>; CPUs and NUMA nodes live under
// devices/system/{cpu/cpuN,node/nodeN}.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "tests/temp_dir.hpp"

namespace mcprun::testing {

/// One PCI function to plant in a fake tree; defaults describe an NVIDIA 3D controller. Every
/// member has an initializer so designated-initializer calls stay -Wextra clean.
struct FakePciDevice {
  std::string bus_id = {};
  std::optional<int> numa_node = 0;  ///< nullopt: no numa_node file at all.
  std::string local_cpulist = {};
  std::string switch_bus_id = {};  ///< Empty: straight under the root complex.
  std::string device_class = "0x030200";
  std::string vendor = "0x10de";
  int link_width = 8, max_link_width = 16;
  std::string link_speed = "8.0 GT/s PCIe", max_link_speed = "16.0 GT/s PCIe";
  bool symlinked = true;  ///< false: a plain directory under bus/pci/devices.
};

/// One logical CPU to plant under devices/system/cpu/cpuN.
struct FakeCpu {
  int id = 0;
  int package = 0;                   ///< physical_package_id: the socket.
  std::string thread_siblings = {};  ///< Empty: the CPU is a core of its own.
  std::string l3_shared = {};        ///< shared_cpu_list of its L3; empty: no cache/ folder.
};

/// A regular machine in Linux's numbering: the first thread of every core (socket by socket,
/// node by node), then every core's second thread, and so on. A node's cores share L3s in runs
/// of cores_per_l3.
struct FakeCpuShape {
  int sockets = 2, nodes_per_socket = 2, cores_per_node = 4, threads_per_core = 2;
  int cores_per_l3 = 2;
};

/// "0-1,16-17" for a sorted list, as the kernel writes it.
inline std::string fake_cpulist(const std::vector<int>& cpus) {
  std::string text;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!text.empty()) text += ',';
    text += std::to_string(cpus[i]) + (j > i ? "-" + std::to_string(cpus[j]) : "");
    i = j + 1;
  }
  return text;
}

/// A fresh temp sysfs root, removed with everything under it when the test ends.
class FakeSysfs {
 public:
  FakeSysfs() { std::filesystem::create_directories(root_ / "bus/pci/devices"); }

  const std::filesystem::path& root() const { return root_; }

  /// topology/{physical_package_id,thread_siblings_list} and, with an L3, cache/index0-3 as on
  /// x86: L1 data, L1 instruction and L2 private to the core, then the shared L3.
  void add_cpu(const FakeCpu& cpu) {
    const auto dir = root_ / "devices/system/cpu" / ("cpu" + std::to_string(cpu.id));
    const std::string siblings =
        cpu.thread_siblings.empty() ? std::to_string(cpu.id) : cpu.thread_siblings;
    std::filesystem::create_directories(dir / "topology");
    write(dir / "topology/physical_package_id", std::to_string(cpu.package));
    write(dir / "topology/thread_siblings_list", siblings);
    if (cpu.l3_shared.empty()) return;
    const struct {
      const char* type;
      int level;
      std::string shared;
    } caches[] = {{"Data", 1, siblings},
                  {"Instruction", 1, siblings},
                  {"Unified", 2, siblings},
                  {"Unified", 3, cpu.l3_shared}};
    for (size_t i = 0; i < std::size(caches); ++i) {
      const auto index = dir / "cache" / ("index" + std::to_string(i));
      std::filesystem::create_directories(index);
      write(index / "type", caches[i].type);
      write(index / "level", std::to_string(caches[i].level));
      write(index / "shared_cpu_list", caches[i].shared);
    }
  }

  void add_numa_node(int node, const std::string& cpulist) {
    const auto dir = root_ / "devices/system/node" / ("node" + std::to_string(node));
    std::filesystem::create_directories(dir);
    write(dir / "cpulist", cpulist);
  }

  /// Plants every CPU and NUMA node of `shape`.
  void add_cpus(const FakeCpuShape& shape) {
    const int cores = shape.sockets * shape.nodes_per_socket * shape.cores_per_node;
    auto threads_of = [&](int first_core, int count) {
      std::vector<int> cpus;
      for (int t = 0; t < shape.threads_per_core; ++t)
        for (int c = first_core; c < first_core + count; ++c) cpus.push_back(t * cores + c);
      std::sort(cpus.begin(), cpus.end());
      return cpus;
    };
    const int nodes = shape.sockets * shape.nodes_per_socket;
    std::vector<int> node_ids;
    for (int node = 0; node < nodes; ++node) node_ids.push_back(node);
    write_attribute("devices/system/node/possible", fake_cpulist(node_ids));
    for (int node = 0; node < nodes; ++node) {
      const int first = node * shape.cores_per_node;
      add_numa_node(node, fake_cpulist(threads_of(first, shape.cores_per_node)));
      for (int core = first; core < first + shape.cores_per_node; ++core) {
        const int l3_first = first + (core - first) / shape.cores_per_l3 * shape.cores_per_l3;
        const int l3_cores = std::min(shape.cores_per_l3, first + shape.cores_per_node - l3_first);
        for (int cpu : threads_of(core, 1))
          add_cpu({.id = cpu,
                   .package = node / shape.nodes_per_socket,
                   .thread_siblings = fake_cpulist(threads_of(core, 1)),
                   .l3_shared = fake_cpulist(threads_of(l3_first, l3_cores))});
      }
    }
  }

  /// The driver's <root>/proc/driver/nvidia/gpus/<bus id>/information for one GPU, in the layout
  /// driver 580 writes (tabs included); point MCPRUN_PROC_ROOT at proc_root().
  void add_driver_information(const std::string& bus_id, const std::string& uuid, int minor = 0) {
    const auto dir = proc_root() / "driver/nvidia/gpus" / bus_id;
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "information")
        << "Model: \t\t NVIDIA H200\nIRQ:   \t\t 0\nGPU UUID: \t " << uuid
        << "\nVideo BIOS: \t 96.00.af.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
           "DMA Mask: \t 0xfffffffffffff\nBus Location: \t "
        << bus_id << "\nDevice Minor: \t " << minor << "\nGPU Excluded:\t No\n";
  }

  std::filesystem::path proc_root() const { return root_ / "proc"; }

  /// Writes one attribute at `relative` under the root, making its folders.
  void write_attribute(const std::string& relative, const std::string& value) {
    std::filesystem::create_directories((root_ / relative).parent_path());
    write(root_ / relative, value);
  }

  void add(const FakePciDevice& device) {
    const auto link = root_ / "bus/pci/devices" / device.bus_id;
    auto dir = link;
    if (device.symlinked) {
      dir = root_ / "devices" / ("pci" + device.bus_id.substr(0, device.bus_id.find(':')) + ":00");
      if (!device.switch_bus_id.empty()) dir /= device.switch_bus_id;
      dir /= device.bus_id;
    }
    std::filesystem::create_directories(dir);
    write(dir / "vendor", device.vendor);
    write(dir / "class", device.device_class);
    if (device.numa_node) write(dir / "numa_node", std::to_string(*device.numa_node));
    write(dir / "local_cpulist", device.local_cpulist);
    write(dir / "current_link_width", std::to_string(device.link_width));
    write(dir / "max_link_width", std::to_string(device.max_link_width));
    write(dir / "current_link_speed", device.link_speed);
    write(dir / "max_link_speed", device.max_link_speed);
    if (device.symlinked)
      std::filesystem::create_symlink(std::filesystem::relative(dir, link.parent_path()), link);
  }

 private:
  static void write(const std::filesystem::path& path, const std::string& value) {
    std::ofstream(path) << value << "\n";
  }
  TempDir dir_{"mcprun-sysfs"};
  const std::filesystem::path& root_ = dir_.path();
};

}  // namespace mcprun::testing
