#include "common/topology.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

namespace mcprun {
namespace fs = std::filesystem;
namespace {

constexpr unsigned kNvidiaVendor = 0x10de;
constexpr unsigned kVgaClass = 0x0300, k3dClass = 0x0302;

/// First line of a sysfs attribute, or "" when it is missing.
std::string read_attribute(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

std::optional<long> parse_number(const std::string& text, int base) {
  std::string_view view(text);
  if (base == 16 && (view.starts_with("0x") || view.starts_with("0X"))) view.remove_prefix(2);
  long value = 0;
  auto [end, ec] = std::from_chars(view.data(), view.data() + view.size(), value, base);
  if (ec != std::errc() || end != view.data() + view.size() || view.empty()) return std::nullopt;
  return value;
}

std::string trim(std::string text) {
  auto not_space = [](unsigned char c) { return !std::isspace(c); };
  text.erase(text.begin(), std::find_if(text.begin(), text.end(), not_space));
  text.erase(std::find_if(text.rbegin(), text.rend(), not_space).base(), text.end());
  return text;
}

/// Bridges between the pciDDDD:BB root and the device in the resolved sysfs path, root first.
std::vector<std::string> pci_parents_of(const fs::path& entry) {
  std::error_code ec;
  if (!fs::is_symlink(entry, ec)) return {};
  fs::path target = fs::read_symlink(entry, ec);
  if (ec) return {};
  if (target.is_relative()) target = entry.parent_path() / target;
  target = target.lexically_normal();
  std::vector<std::string> parts;
  bool in_tree = false;
  for (const fs::path& part : target) {
    std::string name = part.string();
    if (name.rfind("pci", 0) == 0 && name.find(':') != std::string::npos) in_tree = true;
    if (in_tree) parts.push_back(name);
  }
  if (!parts.empty()) parts.pop_back();  // The device itself.
  return parts;
}

}  // namespace

std::string GpuDevice::switch_id() const { return pci_parents.empty() ? "" : pci_parents.back(); }

std::string GpuDevice::cuda_visible_name() const {
  return uuid.empty() ? std::to_string(pci_index) : uuid;
}

fs::path sysfs_root() {
  const char* root = std::getenv("MCPRUN_SYSFS_ROOT");
  return root && *root ? fs::path(root) : fs::path("/sys");
}

std::optional<std::vector<int>> parse_cpulist(const std::string& text) {
  std::vector<int> cpus;
  std::string list = trim(text);
  if (list.empty()) return cpus;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    auto dash = item.find('-');
    auto first = parse_number(item.substr(0, dash), 10);
    auto last = dash == std::string::npos ? first : parse_number(item.substr(dash + 1), 10);
    if (!first || !last || *first < 0 || *last < *first) return std::nullopt;
    for (long cpu = *first; cpu <= *last; ++cpu) cpus.push_back(static_cast<int>(cpu));
  }
  if (list.back() == ',') return std::nullopt;
  return cpus;
}

std::vector<GpuDevice> discover_gpus(const fs::path& sysfs) {
  std::vector<GpuDevice> gpus;
  std::error_code ec;
  const fs::path devices = sysfs / "bus" / "pci" / "devices";
  for (const auto& entry : fs::directory_iterator(devices, ec)) {
    const fs::path dir = entry.path();
    auto vendor = parse_number(read_attribute(dir / "vendor"), 16);
    auto device_class = parse_number(read_attribute(dir / "class"), 16);
    if (!vendor || *vendor != kNvidiaVendor || !device_class) continue;
    unsigned base_class = static_cast<unsigned>(*device_class) >> 8;
    if (base_class != kVgaClass && base_class != k3dClass) continue;

    GpuDevice gpu;
    gpu.bus_id = dir.filename().string();
    std::transform(gpu.bus_id.begin(), gpu.bus_id.end(), gpu.bus_id.begin(), ::tolower);
    gpu.numa_node = static_cast<int>(parse_number(read_attribute(dir / "numa_node"), 10).value_or(-1));
    gpu.local_cpus = parse_cpulist(read_attribute(dir / "local_cpulist")).value_or(std::vector<int>{});
    gpu.pci_parents = pci_parents_of(dir);
    gpu.link_width = static_cast<int>(parse_number(read_attribute(dir / "current_link_width"), 10).value_or(0));
    gpu.max_link_width = static_cast<int>(parse_number(read_attribute(dir / "max_link_width"), 10).value_or(0));
    gpu.link_speed = read_attribute(dir / "current_link_speed");
    gpu.max_link_speed = read_attribute(dir / "max_link_speed");
    gpus.push_back(std::move(gpu));
  }
  std::sort(gpus.begin(), gpus.end(),
            [](const GpuDevice& a, const GpuDevice& b) { return a.bus_id < b.bus_id; });
  for (size_t i = 0; i < gpus.size(); ++i) gpus[i].pci_index = static_cast<int>(i);
  return gpus;
}

TopologyOrder topology_order(std::vector<GpuDevice> gpus, const std::optional<std::string>& allowed) {
  TopologyOrder order;
  if (allowed) {
    std::vector<GpuDevice> chosen;
    std::stringstream in(*allowed);
    for (std::string item; std::getline(in, item, ',');) {
      item = trim(item);
      if (item.empty()) continue;
      auto matches = [&](const GpuDevice& gpu) {
        if (auto index = parse_number(item, 10)) return gpu.pci_index == *index;
        return !gpu.uuid.empty() && gpu.uuid.rfind(item, 0) == 0;
      };
      auto it = std::find_if(gpus.begin(), gpus.end(), matches);
      if (it == gpus.end()) {
        order.error = "'" + item + "' matches no GPU: " +
                      (gpus.empty() ? std::string("none were found")
                                    : std::to_string(gpus.size()) + " found, indices 0-" +
                                          std::to_string(gpus.size() - 1) + " or their UUIDs");
        return order;
      }
      if (std::none_of(chosen.begin(), chosen.end(),
                       [&](const GpuDevice& g) { return g.bus_id == it->bus_id; }))
        chosen.push_back(*it);
    }
    gpus = std::move(chosen);
  }
  // A switch group sorts by the smallest bus id under it, so groups keep PCI order.
  std::map<std::string, std::string> first_bus_under_switch;
  for (const GpuDevice& gpu : gpus) {
    auto [it, inserted] = first_bus_under_switch.emplace(gpu.switch_id(), gpu.bus_id);
    if (!inserted) it->second = std::min(it->second, gpu.bus_id);
  }
  auto key = [&](const GpuDevice& gpu) {
    int numa = gpu.numa_node < 0 ? INT32_MAX : gpu.numa_node;  // Unknown NUMA sorts last.
    return std::tuple(numa, first_bus_under_switch[gpu.switch_id()], gpu.bus_id);
  };
  std::sort(gpus.begin(), gpus.end(),
            [&](const GpuDevice& a, const GpuDevice& b) { return key(a) < key(b); });
  order.gpus = std::move(gpus);
  return order;
}

}  // namespace mcprun
