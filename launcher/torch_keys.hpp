// Every store key name mcprun relies on, in one table: a new torch version is a one-line change.
//
// With TORCHELASTIC_USE_AGENT_STORE=True, torch's env:// init wraps the agent's store as
// PrefixStore("/worker/attempt_<restart count>"), then init_process_group adds "default_pg".
// Key                                                          torch    written by
// /worker/attempt_<n>/default_pg/store_based_barrier_key:1      1.x      every rank: add(1), then polls add(0)
// /worker/attempt_<n>/default_pg/store_based_barrier_key:<g>    2.x      the same, only with TORCH_DIST_INIT_BARRIER=1
// init/                                                         1.x/2.x  every TCPStore client on connect (not prefixed)
#pragma once

#include <string>
#include <string_view>

namespace mcprun::torch_keys {

inline constexpr std::string_view kAttemptPrefix = "/worker/attempt_";
inline constexpr std::string_view kInitBarrier = "/default_pg/store_based_barrier_key:";
/// torch 2.x runs the init barrier only when this is "1"; mcprun sets it unless the user did.
inline constexpr std::string_view kInitBarrierSwitch = "TORCH_DIST_INIT_BARRIER";

/// The init barrier's counter for attempt `restart_count`, up to the group suffix.
inline std::string init_barrier_prefix(int restart_count) {
  return std::string(kAttemptPrefix) + std::to_string(restart_count) + std::string(kInitBarrier);
}

/// Whether `key` is the default process group's init barrier counter of that attempt.
inline bool is_init_barrier(std::string_view key, int restart_count) {
  const std::string prefix = init_barrier_prefix(restart_count);
  return key.size() > prefix.size() && key.substr(0, prefix.size()) == prefix &&
         key.find('/', prefix.size()) == std::string_view::npos;  // Not ".../last_worker".
}

}  // namespace mcprun::torch_keys
