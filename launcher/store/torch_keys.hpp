// Every store key name mcprun relies on, in one table: a new torch version is a one-line change.
//
// Keys as they arrive on the wire, captured from real clients by scripts/capture-store-traffic
// (tests/captures/): torch's TCPStore client puts its own "/" before every key, and torch 1.x's
// env:// init with TORCHELASTIC_USE_AGENT_STORE=True adds PrefixStore("/worker/attempt_<n>"),
// which torch 2.x dropped because it expects a fresh store per attempt (mcprun gives it one).
// Key on the wire                                                  torch  written by
// //worker/attempt_<n>/default_pg/store_based_barrier_key:1        1.13   every rank: add(1), then
// polls add(0) /default_pg/store_based_barrier_key:0                            2.13   the same,
// only with TORCH_DIST_INIT_BARRIER=1 /default_pg/store_based_barrier_key:0:last_worker 2.13   the
// last rank in; the others wait on it
// //worker/attempt_<n>/default_pg/0/0/<rank>, .../0/SEQ_NUM_...    1.13   each rank's gloo address
// /default_pg/0//cpu//0/<rank>                                     2.13   each rank's gloo address
#pragma once

#include <string_view>

namespace mcprun::torch_keys {

/// The TCPStore client's own prefix, before any PrefixStore's.
inline constexpr std::string_view kClientPrefix = "/";
/// torch 1.x's per-attempt PrefixStore over the agent store; a number follows.
inline constexpr std::string_view kAttemptPrefix = "/worker/attempt_";
/// The default process group's PrefixStore; every key of its init lives under it.
inline constexpr std::string_view kDefaultGroup = "/default_pg/";
inline constexpr std::string_view kInitBarrier = "store_based_barrier_key:";

/// What follows the default process group's prefix in `key`; empty when the key is not the
/// default group's. Both dialects and any attempt number: each attempt has a store of its own,
/// so no other attempt's keys can be in it.
inline std::string_view default_group_key(std::string_view key) {
  if (!key.starts_with(kClientPrefix)) return {};
  key.remove_prefix(kClientPrefix.size());
  if (key.starts_with(kAttemptPrefix)) {  // torch 1.x: "/worker/attempt_<n>/default_pg/..."
    key.remove_prefix(kAttemptPrefix.size());
    const size_t digits = key.find_first_not_of("0123456789");
    if (digits == 0 || digits == std::string_view::npos) return {};
    key.remove_prefix(digits);
  }
  // torch 2.x: "default_pg/...", the client's "/" the only one before it.
  std::string_view group = key.starts_with('/') ? kDefaultGroup : kDefaultGroup.substr(1);
  if (!key.starts_with(group)) return {};
  return key.substr(group.size());
}

/// Whether `key` is the default process group's init barrier counter.
inline bool is_init_barrier(std::string_view key) {
  std::string_view rest = default_group_key(key);
  if (rest.substr(0, kInitBarrier.size()) != kInitBarrier) return false;
  rest.remove_prefix(kInitBarrier.size());
  // The counter ends in the group's number; ":last_worker" and the like are not it.
  return !rest.empty() && rest.find_first_not_of("0123456789") == std::string_view::npos;
}

/// Whether `key` belongs to the default process group's init (its gloo/NCCL addresses,
/// sequence numbers, barrier): a rank writing one has reached init_process_group.
inline bool is_default_group_key(std::string_view key) { return !default_group_key(key).empty(); }

}  // namespace mcprun::torch_keys
