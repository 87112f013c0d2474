// What the doctor's checks share: a finding of each kind, list text, NCCL's interface rule,
// the first address of a host. Only the checks' own
// files include it.
#pragma once

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "launcher/commands/doctor.hpp"

namespace mcprun::doctor_findings {

inline CheckResult ok(std::string name, std::string finding) {
  return {std::move(name), CheckStatus::kOk, std::move(finding), ""};
}
inline CheckResult warn(std::string name, std::string finding, std::string remedy) {
  return {std::move(name), CheckStatus::kWarn, std::move(finding), std::move(remedy)};
}
inline CheckResult fail(std::string name, std::string finding, std::string remedy) {
  return {std::move(name), CheckStatus::kFail, std::move(finding), std::move(remedy)};
}

inline std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, separator);)
    if (!item.empty()) items.push_back(item);
  return items;
}

inline std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : separator) + item;
  return text;
}

/// InfiniBand/RoCE adapters show up under class/infiniband.
inline bool has_infiniband(const std::filesystem::path& sysfs) {
  std::error_code ec;
  std::filesystem::directory_iterator it(sysfs / "class" / "infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator();
}

/// NCCL_SOCKET_IFNAME's rule: comma-separated prefixes, "=" for exact names, a leading "^" to
/// exclude the listed ones instead.
inline bool nccl_interface_matches(std::string spec, const std::string& interface) {
  const bool exclude = spec.starts_with("^");
  if (exclude) spec.erase(0, 1);
  const bool exact = spec.starts_with("=");
  if (exact) spec.erase(0, 1);
  bool listed = false;
  for (const std::string& item : split(spec, ','))
    listed = listed || (exact ? interface == item : interface.starts_with(item));
  return exclude ? !listed : listed;
}

/// The first address `host` resolves to, or why it has none.
struct FirstAddress {
  std::string address;
  std::string error;  ///< Set when `host` does not resolve.
};

inline FirstAddress first_address(const std::string& host, DoctorProbes& probes) {
  auto addresses = probes.resolve(host);
  if (!addresses) return {"", addresses.error().message};
  if (addresses->empty()) return {"", host + " has no address"};
  return {addresses->front(), ""};
}

}  // namespace mcprun::doctor_findings
