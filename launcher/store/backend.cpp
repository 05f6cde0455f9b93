#include "store/backend.hpp"

#include <algorithm>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "gpurun/check.hpp"

namespace gpurun::store {

namespace {

bool is_c_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// Parses like C's strtoll/std::stoll in base 10: leading whitespace, optional
// sign, at least one digit, trailing bytes ignored. nullopt when no digit or
// out of int64 range.
std::optional<int64_t> parse_leading_int64(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size() && is_c_space(s[i])) ++i;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i >= s.size() || s[i] < '0' || s[i] > '9') return std::nullopt;
  // Accumulate as a negative number so INT64_MIN is representable.
  int64_t v = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    const int d = s[i] - '0';
    if (v < (std::numeric_limits<int64_t>::min() + d) / 10) return std::nullopt;
    v = v * 10 - d;
  }
  if (!negative) {
    if (v == std::numeric_limits<int64_t>::min()) return std::nullopt;
    v = -v;
  }
  return v;
}

}  // namespace

Backend::Backend(Limits limits, Notify notify) : limits_(limits), notify_(std::move(notify)) {}

void Backend::set_notify(Notify notify) {
  const std::lock_guard<std::mutex> lock(mu_);
  notify_ = std::move(notify);
}

void Backend::set_write_observer(std::string prefix, WriteObserver observer) {
  const std::lock_guard<std::mutex> lock(mu_);
  observer_prefix_ = std::move(prefix);
  observer_ = std::move(observer);
}

bool Backend::present(const std::string& key) const {
  if (kv_.count(key) != 0) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

void Backend::set(const std::string& key, std::string value) {
  const std::lock_guard<std::mutex> lock(mu_);
  set_locked(key, std::move(value));
}

void Backend::set_locked(const std::string& key, std::string value) {
  kv_[key] = std::move(value);
  wake_all(key);
}

std::string Backend::compare_set(const std::string& key, const std::string& expected,
                                 std::string desired) {
  const std::lock_guard<std::mutex> lock(mu_);
  std::string reply;
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    if (expected.empty()) {
      kv_.emplace(key, desired);
      reply = std::move(desired);
    } else {
      reply = expected;
    }
  } else if (it->second == expected) {
    it->second = desired;
    reply = std::move(desired);
  } else {
    reply = it->second;
  }
  wake_all(key);
  return reply;
}

std::string Backend::get(const std::string& key) const {
  const std::lock_guard<std::mutex> lock(mu_);
  return get_locked(key);
}

std::string Backend::get_locked(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? std::string() : it->second;
}

int64_t Backend::add(const std::string& key, int64_t delta) {
  const std::lock_guard<std::mutex> lock(mu_);
  int64_t current = 0;
  auto it = kv_.find(key);
  if (it != kv_.end()) {
    auto parsed = parse_leading_int64(it->second);
    if (!parsed) {
      throw StoreError(fmt::format("ADD on key {}: the current value {} is not an integer",
                                   printable(key), printable(it->second, 64)));
    }
    current = *parsed;
  }
  int64_t result = 0;
  if (__builtin_add_overflow(current, delta, &result)) {
    throw StoreError(fmt::format("ADD on key {}: {} + {} overflows a 64-bit integer",
                                 printable(key), current, delta));
  }
  kv_[key] = std::to_string(result);
  wake_all(key);
  return result;
}

bool Backend::check(const std::vector<std::string>& keys) const {
  const std::lock_guard<std::mutex> lock(mu_);
  return std::all_of(keys.begin(), keys.end(), [this](const auto& k) { return present(k); });
}

bool Backend::wait(ConnectionId conn, const std::vector<std::string>& keys) {
  const std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    if (!present(k)) missing.push_back(k);
  }
  if (missing.empty()) return true;
  std::size_t& registered = registrations_by_conn_[conn];
  if (registered + missing.size() > limits_.max_pending_waits_per_connection) {
    const std::size_t had = registered;
    if (had == 0) registrations_by_conn_.erase(conn);
    throw StoreError(fmt::format(
        "WAIT on {} missing key(s) with {} already pending exceeds the limit of {} pending "
        "wait registrations per connection",
        missing.size(), had, limits_.max_pending_waits_per_connection));
  }
  registered += missing.size();
  const WaitId id = next_wait_id_++;
  for (const auto& k : missing) waiters_by_key_[k].push_back(id);
  waits_by_conn_[conn].push_back(id);
  waits_.emplace(id, PendingWait{conn, missing.size(), std::move(missing)});
  return false;
}

void Backend::count_down(WaitId id) {
  auto it = waits_.find(id);
  if (it == waits_.end()) return;
  const ConnectionId conn = it->second.conn;
  auto reg = registrations_by_conn_.find(conn);
  if (reg != registrations_by_conn_.end() && --reg->second == 0) registrations_by_conn_.erase(reg);
  if (--it->second.remaining > 0) return;
  forget(id);
  if (notify_) notify_(conn);
}

void Backend::forget(WaitId id) {
  auto it = waits_.find(id);
  if (it == waits_.end()) return;
  auto conn_it = waits_by_conn_.find(it->second.conn);
  if (conn_it != waits_by_conn_.end()) {
    auto& ids = conn_it->second;
    ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
    if (ids.empty()) waits_by_conn_.erase(conn_it);
  }
  waits_.erase(it);
}

void Backend::wake_all(const std::string& key) {
  auto it = waiters_by_key_.find(key);
  if (it != waiters_by_key_.end()) {
    std::deque<WaitId> ids = std::move(it->second);
    waiters_by_key_.erase(it);
    for (WaitId id : ids) count_down(id);
  }
  if (observer_ && key.compare(0, observer_prefix_.size(), observer_prefix_) == 0) observer_(key);
}

void Backend::wake_one(const std::string& key) {
  auto it = waiters_by_key_.find(key);
  if (it == waiters_by_key_.end()) return;
  const WaitId id = it->second.front();
  it->second.pop_front();
  if (it->second.empty()) waiters_by_key_.erase(it);
  count_down(id);
}

void Backend::cancel_waits(ConnectionId conn) {
  const std::lock_guard<std::mutex> lock(mu_);
  cancel_waits_locked(conn);
}

void Backend::cancel_waits_locked(ConnectionId conn) {
  auto conn_it = waits_by_conn_.find(conn);
  if (conn_it != waits_by_conn_.end()) {
    for (WaitId id : conn_it->second) {
      auto w = waits_.find(id);
      if (w == waits_.end()) continue;
      for (const auto& k : w->second.keys) {
        auto kit = waiters_by_key_.find(k);
        if (kit == waiters_by_key_.end()) continue;
        auto& ids = kit->second;
        ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
        if (ids.empty()) waiters_by_key_.erase(kit);
      }
      waits_.erase(w);
    }
    waits_by_conn_.erase(conn_it);
  }
  registrations_by_conn_.erase(conn);
}

int64_t Backend::num_keys() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(kv_.size());
}

std::size_t Backend::num_pending_waits() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return waits_.size();
}

bool Backend::delete_key(const std::string& key) {
  const std::lock_guard<std::mutex> lock(mu_);
  return kv_.erase(key) != 0;
}

void Backend::append(const std::string& key, std::string_view value) {
  const std::lock_guard<std::mutex> lock(mu_);
  kv_[key].append(value);
  wake_all(key);
}

std::vector<std::string> Backend::multi_get(const std::vector<std::string>& keys) const {
  const std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(get_locked(k));
  return out;
}

void Backend::multi_set(const std::vector<std::string>& keys, std::vector<std::string> values) {
  GPURUN_CHECK(keys.size() == values.size(), "MULTI_SET with {} keys and {} values", keys.size(),
               values.size());
  const std::lock_guard<std::mutex> lock(mu_);
  for (std::size_t i = 0; i < keys.size(); ++i) set_locked(keys[i], std::move(values[i]));
}

void Backend::queue_push(const std::string& key, std::string value) {
  const std::lock_guard<std::mutex> lock(mu_);
  queues_[key].push_back(std::move(value));
  wake_one(key);
}

std::pair<int64_t, std::optional<std::string>> Backend::queue_pop(const std::string& key) {
  const std::lock_guard<std::mutex> lock(mu_);
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) return {0, std::nullopt};
  const auto len = static_cast<int64_t>(it->second.size());
  std::string head = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  return {len, std::move(head)};
}

int64_t Backend::queue_len(const std::string& key) const {
  const std::lock_guard<std::mutex> lock(mu_);
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

std::vector<std::string> Backend::list_keys() const {
  const std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.reserve(kv_.size());
  for (const auto& [k, v] : kv_) out.push_back(k);
  return out;
}

void Backend::reset_keyspace(std::string_view keep_prefix) {
  const std::lock_guard<std::mutex> lock(mu_);
  auto drop = [keep_prefix](const auto& entry) { return !entry.first.starts_with(keep_prefix); };
  std::erase_if(kv_, drop);
  std::erase_if(queues_, drop);
}

std::size_t Backend::pending_waits(ConnectionId conn) const {
  const std::lock_guard<std::mutex> lock(mu_);
  auto it = registrations_by_conn_.find(conn);
  return it == registrations_by_conn_.end() ? 0 : it->second;
}

}  // namespace gpurun::store
