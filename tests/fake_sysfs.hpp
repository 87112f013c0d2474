// Builds fake sysfs trees for topology tests, mirroring the real layout: bus/pci/devices/<bdf> is a
// relative symlink into devices/pci<domain>:00/[<switch>/]<bdf>.
#pragma once

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "tests/temp_dir.hpp"

namespace mcprun::testing {

/// One PCI function to plant in a fake tree; defaults describe an NVIDIA 3D controller. Every
/// member has an initializer so designated-initializer calls stay -Wextra clean.
struct FakePciDevice {
  std::string bus_id = {};
  std::optional<int> numa_node = 0;  ///< nullopt: no numa_node file at all.
  std::string local_cpulist = {};
  std::string switch_bus_id = {};    ///< Empty: straight under the root complex.
  std::string device_class = "0x030200";
  std::string vendor = "0x10de";
  int link_width = 8, max_link_width = 16;
  std::string link_speed = "8.0 GT/s PCIe", max_link_speed = "16.0 GT/s PCIe";
  bool symlinked = true;             ///< false: a plain directory under bus/pci/devices.
};

/// A fresh temp sysfs root, removed with everything under it when the test ends.
class FakeSysfs {
 public:
  FakeSysfs() { std::filesystem::create_directories(root_ / "bus/pci/devices"); }

  const std::filesystem::path& root() const { return root_; }

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
