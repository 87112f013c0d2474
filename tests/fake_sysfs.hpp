// Builds fake sysfs trees for topology tests, mirroring the real layout: bus/pci/devices/<bdf> is a
// relative symlink into devices/pci<domain>:<bus>/[<switch>/]<bdf>.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace mcprun::testing {

/// A temp sysfs root that removes itself.
class FakeSysfs {
 public:
  FakeSysfs() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "mcprun-sysfs-XXXXXX").string();
    root_ = ::mkdtemp(pattern.data());
    std::filesystem::create_directories(root_ / "bus/pci/devices");
  }
  ~FakeSysfs() { std::filesystem::remove_all(root_); }
  FakeSysfs(const FakeSysfs&) = delete;
  FakeSysfs& operator=(const FakeSysfs&) = delete;

  const std::filesystem::path& root() const { return root_; }

  /// Adds a PCI function; `switch_bdf` empty puts it straight under the root complex.
  void add(const std::string& bdf, int numa_node, const std::string& cpulist,
           const std::string& switch_bdf = "", const std::string& device_class = "0x030200",
           const std::string& vendor = "0x10de", bool write_numa = true) {
    auto dir = root_ / "devices" / ("pci" + bdf.substr(0, 4) + ":00");
    if (!switch_bdf.empty()) dir /= switch_bdf;
    dir /= bdf;
    std::filesystem::create_directories(dir);
    write(dir / "vendor", vendor);
    write(dir / "class", device_class);
    if (write_numa) write(dir / "numa_node", std::to_string(numa_node));
    write(dir / "local_cpulist", cpulist);
    write(dir / "current_link_width", "8");
    write(dir / "max_link_width", "16");
    auto link = root_ / "bus/pci/devices" / bdf;
    std::filesystem::create_symlink(std::filesystem::relative(dir, link.parent_path()), link);
  }

 private:
  static void write(const std::filesystem::path& path, const std::string& value) {
    std::ofstream(path) << value << "\n";
  }
  std::filesystem::path root_;
};

}  // namespace mcprun::testing
