#include "common/topology.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

namespace mcprun {
namespace fs = std::filesystem;
namespace {

constexpr unsigned kNvidiaVendor = 0x10de;
constexpr unsigned kVgaClass = 0x0300, k3dClass = 0x0302;
/// Above any kernel's NR_CPUS: a cpulist naming more is garbage, not a machine.
constexpr long kMaxCpu = 1 << 20;

std::string trim(std::string text) {
  auto not_space = [](unsigned char c) { return !std::isspace(c); };
  text.erase(text.begin(), std::find_if(text.begin(), text.end(), not_space));
  text.erase(std::find_if(text.rbegin(), text.rend(), not_space).base(), text.end());
  return text;
}

std::string lowercase(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

/// The whole text must be a number ("0x" allowed in base 16); nullopt otherwise.
std::optional<long> parse_number(std::string_view view, int base) {
  if (base == 16 && (view.starts_with("0x") || view.starts_with("0X"))) view.remove_prefix(2);
  if (view.empty()) return std::nullopt;
  long value = 0;
  auto [end, ec] = std::from_chars(view.data(), view.data() + view.size(), value, base);
  if (ec != std::errc() || end != view.data() + view.size()) return std::nullopt;
  return value;
}

/// "pci0000:00" (or a wider VMD domain): the root-complex directory that starts a device path.
bool is_pci_root(const std::string& name) {
  if (!name.starts_with("pci")) return false;
  auto colon = name.find(':', 3);
  if (colon == std::string::npos) return false;
  return parse_number(std::string_view(name).substr(3, colon - 3), 16) &&
         parse_number(std::string_view(name).substr(colon + 1), 16);
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
    if (!in_tree && is_pci_root(name)) in_tree = true;
    if (in_tree) parts.push_back(name);
  }
  if (!parts.empty()) parts.pop_back();  // The device itself.
  return parts;
}

/// (domain, bus, device, function) as numbers, so a 5-digit VMD domain still sorts right;
/// an unparsable id sorts after all parsable ones, by its text.
std::tuple<bool, long, long, long, long, std::string> bus_order_key(const std::string& bus_id) {
  long domain = 0, bus = 0, device = 0, function = 0;
  auto first = bus_id.find(':'), second = bus_id.find(':', first + 1), dot = bus_id.rfind('.');
  if (first != std::string::npos && second != std::string::npos && dot != std::string::npos &&
      dot > second) {
    std::string_view id(bus_id);
    auto d = parse_number(id.substr(0, first), 16);
    auto b = parse_number(id.substr(first + 1, second - first - 1), 16);
    auto s = parse_number(id.substr(second + 1, dot - second - 1), 16);
    auto f = parse_number(id.substr(dot + 1), 16);
    if (d && b && s && f) return {false, *d, *b, *s, *f, bus_id};
  }
  return {true, domain, bus, device, function, bus_id};
}

bool bus_less(const std::string& a, const std::string& b) {
  return bus_order_key(a) < bus_order_key(b);
}

/// "0=0000:1a:00.0 (GPU-...), 1=...": what the user could have named instead.
std::string describe_choices(const std::vector<GpuDevice>& gpus) {
  if (gpus.empty()) return "no GPUs were found";
  std::string text = "GPUs found: ";
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(gpus[i].pci_index) + "=" + gpus[i].bus_id;
    if (!gpus[i].uuid.empty()) text += " (" + gpus[i].uuid + ")";
  }
  return text;
}

/// The GPUs one CUDA_VISIBLE_DEVICES entry names: an index, a full UUID or a "GPU-" prefix.
std::vector<const GpuDevice*> matching(const std::vector<GpuDevice>& gpus,
                                       const std::string& item) {
  std::vector<const GpuDevice*> found;
  auto index = parse_number(item, 10);
  for (const GpuDevice& gpu : gpus) {
    bool hit =
        index ? gpu.pci_index == *index
              : !gpu.uuid.empty() &&
                    (gpu.uuid == item || (item.starts_with("GPU-") && gpu.uuid.starts_with(item)));
    if (hit) found.push_back(&gpu);
  }
  return found;
}

}  // namespace

std::string read_attribute(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return trim(line);
}

int read_int(const fs::path& path, int fallback) {
  auto value = parse_number(read_attribute(path), 10);
  return value && *value >= INT_MIN && *value <= INT_MAX ? static_cast<int>(*value) : fallback;
}

std::string GpuDevice::switch_id() const { return pci_parents.empty() ? "" : pci_parents.back(); }

std::string GpuDevice::cuda_visible_name() const {
  return uuid.empty() ? std::to_string(pci_index) : uuid;
}

fs::path proc_root() {
  const char* root = std::getenv("MCPRUN_PROC_ROOT");
  return root && *root ? fs::path(root) : fs::path("/proc");
}

std::string normalise_bus_id(std::string_view text) {
  unsigned long domain = 0;
  unsigned bus = 0, device = 0, function = 0;
  const std::string copy(text);
  if (std::sscanf(copy.c_str(), "%lx:%x:%x.%x", &domain, &bus, &device, &function) != 4)
    return lowercase(copy);
  char out[48];
  std::snprintf(out, sizeof out, "%04lx:%02x:%02x.%x", domain, bus, device, function);
  return out;
}

void annotate_with_driver_uuids(std::vector<GpuDevice>& gpus, const fs::path& proc) {
  if (gpus.empty()) return;
  std::error_code ec;
  for (fs::directory_iterator it(proc / "driver" / "nvidia" / "gpus", ec), end; !ec && it != end;
       it.increment(ec)) {
    std::ifstream in(it->path() / "information");
    std::string bus_id = it->path().filename().string(), uuid;
    for (std::string line; std::getline(in, line);) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      const std::string key = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
      if (key == "GPU UUID") uuid = value;
      if (key == "Bus Location") bus_id = value;
    }
    // A container without the driver's rights reads "GPU-????..."; no UUID beats a wrong one.
    const bool well_formed =
        uuid.starts_with("GPU-") && uuid.size() > 4 &&
        uuid.find_first_not_of("0123456789abcdefABCDEF-", 4) == std::string::npos;
    if (!well_formed) continue;
    const std::string normalised = normalise_bus_id(bus_id);
    for (GpuDevice& gpu : gpus)
      if (normalise_bus_id(gpu.bus_id) == normalised) gpu.uuid = uuid;
  }
}

fs::path sysfs_root() {
  const char* root = std::getenv("MCPRUN_SYSFS_ROOT");
  return root && *root ? fs::path(root) : fs::path("/sys");
}

std::string format_cpulist(const std::vector<int>& sorted) {
  std::string text;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (!text.empty()) text += ',';
    text += std::to_string(sorted[i]);
    if (j > i) text += '-' + std::to_string(sorted[j]);
    i = j + 1;
  }
  return text;
}

std::optional<std::vector<int>> parse_cpulist(const std::string& text) {
  std::vector<int> cpus;
  const std::string list = trim(text);
  if (list.empty()) return cpus;
  if (list.back() == ',') return std::nullopt;  // getline would drop the empty last item.
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    auto dash = item.find('-');
    auto first = parse_number(std::string_view(item).substr(0, dash), 10);
    auto last = dash == std::string::npos
                    ? first
                    : parse_number(std::string_view(item).substr(dash + 1), 10);
    if (!first || !last || *first < 0 || *last < *first || *last > kMaxCpu) return std::nullopt;
    for (long cpu = *first; cpu <= *last; ++cpu) cpus.push_back(static_cast<int>(cpu));
  }
  return cpus;
}

std::vector<GpuDevice> discover_gpus(const fs::path& sysfs) {
  std::vector<GpuDevice> gpus;
  std::error_code ec;
  const fs::path devices = sysfs / "bus" / "pci" / "devices";
  // Explicit increment(ec): the range-for form throws if the directory vanishes mid-scan.
  for (fs::directory_iterator it(devices, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path dir = it->path();
    auto vendor = parse_number(read_attribute(dir / "vendor"), 16);
    auto device_class = parse_number(read_attribute(dir / "class"), 16);
    if (!vendor || *vendor != kNvidiaVendor || !device_class) continue;
    const unsigned long base_class = static_cast<unsigned long>(*device_class) >> 8;
    if (base_class != kVgaClass && base_class != k3dClass) continue;

    GpuDevice gpu;
    gpu.bus_id = lowercase(dir.filename().string());
    gpu.numa_node = read_int(dir / "numa_node", -1);
    if (gpu.numa_node < -1) gpu.numa_node = -1;
    gpu.local_cpus =
        parse_cpulist(read_attribute(dir / "local_cpulist")).value_or(std::vector<int>{});
    gpu.pci_parents = pci_parents_of(dir);
    gpu.link_width = read_int(dir / "current_link_width", 0);
    gpu.max_link_width = read_int(dir / "max_link_width", 0);
    gpu.link_speed = read_attribute(dir / "current_link_speed");
    gpu.max_link_speed = read_attribute(dir / "max_link_speed");
    gpus.push_back(std::move(gpu));
  }
  std::sort(gpus.begin(), gpus.end(),
            [](const GpuDevice& a, const GpuDevice& b) { return bus_less(a.bus_id, b.bus_id); });
  for (size_t i = 0; i < gpus.size(); ++i) gpus[i].pci_index = static_cast<int>(i);
  return gpus;
}

TopologyOrder topology_order(std::vector<GpuDevice> gpus,
                             const std::optional<std::string>& allowed) {
  TopologyOrder order;
  if (allowed) {
    std::vector<GpuDevice> chosen;
    std::stringstream in(*allowed);
    for (std::string item; std::getline(in, item, ',');) {
      item = trim(item);
      if (item.empty()) continue;
      auto found = matching(gpus, item);
      if (found.size() != 1) {
        order.error = "'" + item + "' " +
                      (found.empty() ? "matches no GPU" : "matches more than one GPU") + "; " +
                      describe_choices(gpus);
        return order;
      }
      if (std::none_of(chosen.begin(), chosen.end(),
                       [&](const GpuDevice& g) { return g.bus_id == found[0]->bus_id; }))
        chosen.push_back(*found[0]);
    }
    gpus = std::move(chosen);
  }
  // A switch group sorts by the smallest bus id under it, so groups keep PCI order. A GPU with
  // no known parent is a group of its own rather than sharing one nameless "switch".
  std::map<std::string, std::string> first_bus_under_switch;
  for (const GpuDevice& gpu : gpus) {
    if (gpu.switch_id().empty()) continue;
    auto [it, inserted] = first_bus_under_switch.emplace(gpu.switch_id(), gpu.bus_id);
    if (!inserted && bus_less(gpu.bus_id, it->second)) it->second = gpu.bus_id;
  }
  auto key = [&](const GpuDevice& gpu) {
    int numa = gpu.numa_node < 0 ? INT_MAX : gpu.numa_node;  // Unknown NUMA sorts last.
    const std::string& group =
        gpu.switch_id().empty() ? gpu.bus_id : first_bus_under_switch.at(gpu.switch_id());
    return std::tuple(numa, bus_order_key(group), bus_order_key(gpu.bus_id));
  };
  std::stable_sort(gpus.begin(), gpus.end(),
                   [&](const GpuDevice& a, const GpuDevice& b) { return key(a) < key(b); });
  order.gpus = std::move(gpus);
  return order;
}

}  // namespace mcprun
