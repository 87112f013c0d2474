// StoreState: the keys, counters and queues of one store, and its waiters and watchers.
#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "launcher/store/store_wire.hpp"
#include "launcher/store/tcp_store.hpp"

namespace mcprun {
namespace {

/// The counter in `value` as torch reads it with std::stoll: leading blanks, a sign and digits,
/// anything after them ignored; nullopt when there is no number or it does not fit.
std::optional<int64_t> parse_counter(const std::string& value) {
  errno = 0;
  char* end = nullptr;
  const long long number = std::strtoll(value.c_str(), &end, 10);
  if (end == value.c_str() || errno == ERANGE) return std::nullopt;
  return number;
}

/// Two's-complement addition, as torch's counters overflow in practice, without the UB.
int64_t wrapping_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

template <class Value>
Value& entry(StoreKeyMap<Value>& map, std::string_view key) {
  auto it = map.find(key);
  if (it == map.end()) it = map.emplace(std::string(key), Value{}).first;
  return it->second;
}

}  // namespace

void StoreState::set(uint64_t connection, std::string_view key, std::string_view value) {
  auto it = values_.find(key);
  const bool created = it == values_.end();
  if (watched(key))
    notify(key, created ? kKeyCreated : kKeyUpdated, created ? "" : it->second, value);
  if (created) {
    values_.emplace(std::string(key), std::string(value));
  } else {
    it->second.assign(value);
  }
  wake(key);
  outlet_.changed(StoreEvent::Kind::kSet, connection, key, 0);
}

std::string_view StoreState::compare_set(uint64_t connection, std::string_view key,
                                         std::string_view expected, std::string_view desired) {
  auto it = values_.find(key);
  if (it == values_.end()) {
    if (!expected.empty()) return expected;
    if (watched(key)) notify(key, kKeyCreated, "", desired);
    it = values_.emplace(std::string(key), std::string(desired)).first;
  } else {
    if (it->second != expected) return it->second;
    if (watched(key)) notify(key, kKeyUpdated, it->second, desired);
    it->second.assign(desired);
  }
  // torch itself forgets this wake-up, leaving a waiter on a key made by compare_set hanging.
  wake(key);
  outlet_.changed(StoreEvent::Kind::kSet, connection, key, 0);
  return it->second;
}

const std::string* StoreState::get(std::string_view key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

std::optional<int64_t> StoreState::add(uint64_t connection, std::string_view key, int64_t delta) {
  auto it = values_.find(key);
  int64_t total = delta;
  if (it != values_.end()) {
    auto current = parse_counter(it->second);
    if (!current) return std::nullopt;
    total = wrapping_add(*current, delta);
  }
  std::string text = std::to_string(total);
  if (watched(key))
    notify(key, it == values_.end() ? kKeyCreated : kKeyUpdated,
           it == values_.end() ? "" : it->second, text);
  if (it == values_.end()) {
    values_.emplace(std::string(key), std::move(text));
  } else {
    it->second = std::move(text);
  }
  wake(key);
  outlet_.changed(StoreEvent::Kind::kAdd, connection, key, total);
  return total;
}

void StoreState::append(uint64_t connection, std::string_view key, std::string_view value) {
  auto it = values_.find(key);
  const bool created = it == values_.end();
  // As torch's server did while it had both: the appended bytes stand as the new value.
  if (watched(key)) notify(key, created ? kKeyCreated : kKeyAppended, "", value);
  if (created) {
    values_.emplace(std::string(key), std::string(value));
  } else {
    it->second.append(value);
  }
  wake(key);
  outlet_.changed(StoreEvent::Kind::kSet, connection, key, 0);
}

bool StoreState::erase(uint64_t connection, std::string_view key) {
  auto it = values_.find(key);
  if (it == values_.end()) return false;
  if (watched(key)) notify(key, kKeyDeleted, it->second, "");
  values_.erase(it);
  outlet_.changed(StoreEvent::Kind::kDeleted, connection, key, 0);
  return true;
}

std::vector<std::string_view> StoreState::keys() const {
  std::vector<std::string_view> names;
  names.reserve(values_.size());
  for (const auto& [key, value] : values_) names.push_back(key);
  return names;
}

bool StoreState::present(std::string_view key) const {
  if (values_.count(key)) return true;
  auto queue = queues_.find(key);
  return queue != queues_.end() && !queue->second.empty();
}

bool StoreState::check(const std::vector<std::string_view>& keys) const {
  return std::all_of(keys.begin(), keys.end(),
                     [this](std::string_view key) { return present(key); });
}

bool StoreState::wait(uint64_t connection, const std::vector<std::string_view>& keys) {
  if (check(keys)) return true;
  add_waiter(connection, keys);
  return false;
}

void StoreState::add_waiter(uint64_t connection, const std::vector<std::string_view>& keys) {
  remove_waiter(connection);
  Waiter waiter;
  for (std::string_view key : keys) {
    if (present(key) || std::find(waiter.keys.begin(), waiter.keys.end(), key) != waiter.keys.end())
      continue;
    waiter.keys.emplace_back(key);
    entry(waiting_on_, key).push_back(connection);
  }
  waiter.missing = waiter.keys.size();
  waiters_.emplace(connection, std::move(waiter));
}

void StoreState::cancel_wait(uint64_t connection) { remove_waiter(connection); }

void StoreState::remove_waiter(uint64_t connection) {
  auto waiter = waiters_.find(connection);
  if (waiter == waiters_.end()) return;
  for (const std::string& key : waiter->second.keys) {
    auto list = waiting_on_.find(key);
    if (list == waiting_on_.end()) continue;  // That key has been set already.
    std::erase(list->second, connection);
    if (list->second.empty()) waiting_on_.erase(list);
  }
  waiters_.erase(waiter);
}

void StoreState::wake(std::string_view key, bool only_one) {
  auto list = waiting_on_.find(key);
  if (list == waiting_on_.end()) return;
  std::vector<uint64_t> connections = std::move(list->second);
  waiting_on_.erase(list);
  size_t next = 0;
  while (next < connections.size()) {
    auto waiter = waiters_.find(connections[next++]);
    if (waiter == waiters_.end() || --waiter->second.missing > 0) continue;
    const uint64_t connection = waiter->first;
    waiters_.erase(waiter);
    outlet_.deliver(connection, std::string_view(&kStopWaiting, 1));
    if (only_one) break;
  }
  // A queue push woke one waiter; the others keep waiting for the next push.
  if (next < connections.size())
    waiting_on_.emplace(
        std::string(key),
        std::vector<uint64_t>(connections.begin() + static_cast<std::ptrdiff_t>(next),
                              connections.end()));
}

std::optional<bool> StoreState::barrier(uint64_t connection, std::string_view key,
                                        int64_t world_size) {
  auto it = values_.find(key);
  int64_t count = 1;
  if (it != values_.end()) {
    auto current = parse_counter(it->second);
    if (!current) return std::nullopt;
    count = wrapping_add(*current, 1);
  }
  std::string text = std::to_string(count);
  if (it == values_.end()) {
    values_.emplace(std::string(key), std::move(text));
  } else {
    it->second = std::move(text);
  }
  outlet_.changed(StoreEvent::Kind::kAdd, connection, key, count);
  // Earlier arrivals wait on the key itself, so only the last arrival may wake them.
  if (count >= world_size) {
    wake(key);
    return true;
  }
  remove_waiter(connection);
  waiters_.emplace(connection, Waiter{1, {std::string(key)}});
  entry(waiting_on_, key).push_back(connection);
  return false;
}

void StoreState::watch(uint64_t connection, std::string_view key) {
  entry(watchers_, key).push_back(connection);
  watched_by_[connection].emplace_back(key);
}

void StoreState::notify(std::string_view key, uint8_t notice, std::string_view old_value,
                        std::string_view new_value) {
  std::string message(1, static_cast<char>(notice));
  append_bytes(message, key);
  append_bytes(message, old_value);
  append_bytes(message, new_value);
  for (uint64_t connection : watchers_.find(key)->second) outlet_.deliver(connection, message);
}

void StoreState::queue_push(std::string_view key, std::string_view value) {
  entry(queues_, key).emplace_back(value);
  wake(key, /*only_one=*/true);
}

std::optional<std::string> StoreState::queue_pop(std::string_view key) {
  auto queue = queues_.find(key);
  if (queue == queues_.end()) return std::nullopt;
  std::string value = std::move(queue->second.front());
  queue->second.pop_front();
  if (queue->second.empty()) queues_.erase(queue);
  return value;
}

int64_t StoreState::queue_length(std::string_view key) const {
  auto queue = queues_.find(key);
  return queue == queues_.end() ? 0 : static_cast<int64_t>(queue->second.size());
}

void StoreState::drop_connection(uint64_t connection) {
  remove_waiter(connection);
  auto watched = watched_by_.find(connection);
  if (watched == watched_by_.end()) return;
  for (const std::string& key : watched->second) {
    auto list = watchers_.find(key);
    if (list == watchers_.end()) continue;
    std::erase(list->second, connection);
    if (list->second.empty()) watchers_.erase(list);
  }
  watched_by_.erase(watched);
}

void StoreState::clear() {
  values_.clear();
  queues_.clear();
  waiting_on_.clear();
  waiters_.clear();
  watchers_.clear();
  watched_by_.clear();
}

}  // namespace mcprun
