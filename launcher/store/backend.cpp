#include "store/backend.hpp"

#include <algorithm>
#include <chrono>
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

// Memory estimates for stored_bytes() (libstdc++, 64-bit; documented in backend.hpp).
// A string: its header, plus a heap block (size + NUL) once it outgrows the inline buffer.
std::size_t string_bytes(std::size_t size) {
  return sizeof(std::string) + (size > 15 ? size + 1 : 0);
}
// A hash-map node: next pointer, cached hash, malloc header.
constexpr std::size_t kNodeBytes = 32;
// An empty std::deque plus the map and the first 512-byte block its first element allocates.
constexpr std::size_t kDequeBytes = sizeof(std::deque<std::string>) + 64 + 512;

std::size_t kv_entry_bytes(std::size_t key_bytes, std::size_t value_bytes) {
  return kNodeBytes + string_bytes(key_bytes) + string_bytes(value_bytes);
}
std::size_t queue_bytes(std::size_t key_bytes) {
  return kNodeBytes + string_bytes(key_bytes) + kDequeBytes;
}
// One key of a pending WAIT: its copy in the wait's list and its waiters_by_key_ entry.
std::size_t wait_key_bytes(std::size_t key_bytes) {
  return 2 * string_bytes(key_bytes) + kNodeBytes + kDequeBytes;
}

}  // namespace

Backend::Backend(Limits limits, Notify notify) : limits_(limits), notify_(std::move(notify)) {}

Backend::~Backend() {
  if (budget_ != nullptr) budget_->release(stored_bytes_);
}

void Backend::set_memory_budget(MemoryBudget* budget) {
  const std::lock_guard<std::mutex> lock(mu_);
  if (budget_ != nullptr) budget_->release(stored_bytes_);
  budget_ = budget;
  if (budget_ != nullptr) budget_->charge(stored_bytes_);
}

std::string Backend::budget_phrase() const {
  if (budget_ == nullptr) return "the store's memory budget";
  return fmt::format("the store's memory budget of {} ({} in use)",
                     MemoryBudget::format_bytes(budget_->limit_bytes()),
                     MemoryBudget::format_bytes(budget_->used_bytes()));
}

std::size_t Backend::stored_bytes() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return stored_bytes_;
}

template <class What>
void Backend::admit_growth(std::size_t bytes, Admit admit, What what) const {
  if (bytes == 0) return;
  if (admit == Admit::kWithinBudget && budget_ != nullptr && !budget_->fits(bytes)) {
    throw StoreError(fmt::format("{} would make the store hold {} more, which does not fit {}",
                                 what(), MemoryBudget::format_bytes(bytes), budget_phrase()));
  }
}

template <class What>
void Backend::grow(std::size_t bytes, Admit admit, What what) {
  admit_growth(bytes, admit, what);
  stored_bytes_ += bytes;
  if (budget_ != nullptr) budget_->charge(bytes);
}

void Backend::shrink(std::size_t bytes) {
  stored_bytes_ -= std::min(bytes, stored_bytes_);
  if (budget_ != nullptr) budget_->release(bytes);
}

std::size_t Backend::set_growth(const std::string& key, std::size_t new_value_bytes) const {
  auto it = kv_.find(key);
  const std::size_t old_bytes = it == kv_.end() ? 0 : kv_entry_bytes(key.size(), it->second.size());
  const std::size_t new_bytes = kv_entry_bytes(key.size(), new_value_bytes);
  return new_bytes > old_bytes ? new_bytes - old_bytes : 0;
}

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

void Backend::set(const std::string& key, std::string value, Admit admit) {
  const std::lock_guard<std::mutex> lock(mu_);
  admit_growth(set_growth(key, value.size()), admit, [&] {
    return fmt::format("SET of key {} with a value of {}", printable(key),
                       MemoryBudget::format_bytes(value.size()));
  });
  set_locked(key, std::move(value));
}

void Backend::set_locked(const std::string& key, std::string value) {
  auto [it, inserted] = kv_.try_emplace(key);
  const std::size_t old_bytes = inserted ? 0 : kv_entry_bytes(key.size(), it->second.size());
  const std::size_t new_bytes = kv_entry_bytes(key.size(), value.size());
  if (new_bytes >= old_bytes) {
    grow(new_bytes - old_bytes, Admit::kAlways, [] { return std::string(); });
  } else {
    shrink(old_bytes - new_bytes);
  }
  it->second = std::move(value);
  wake_all(key);
}

std::string Backend::compare_set(const std::string& key, const std::string& expected,
                                 std::string desired, Admit admit) {
  const std::lock_guard<std::mutex> lock(mu_);
  std::string reply;
  auto it = kv_.find(key);
  const bool store = it == kv_.end() ? expected.empty() : it->second == expected;
  if (store) {
    grow(set_growth(key, desired.size()), admit, [&] {
      return fmt::format("COMPARE_SET of key {} with a value of {}", printable(key),
                         MemoryBudget::format_bytes(desired.size()));
    });
    const std::size_t old_bytes =
        it == kv_.end() ? 0 : kv_entry_bytes(key.size(), it->second.size());
    const std::size_t new_bytes = kv_entry_bytes(key.size(), desired.size());
    if (new_bytes < old_bytes) shrink(old_bytes - new_bytes);
    kv_[key] = desired;
    reply = std::move(desired);
  } else {
    reply = it == kv_.end() ? expected : it->second;
  }
  wake_all(key);
  return reply;
}

std::string Backend::get(const std::string& key, std::size_t max_reply_bytes) const {
  const std::lock_guard<std::mutex> lock(mu_);
  auto it = kv_.find(key);
  if (it != kv_.end() && it->second.size() > max_reply_bytes) {
    throw StoreError(fmt::format(
        "GET request: the reply for key {}, a value of {}, exceeds the {} that replies may "
        "still use of {}",
        printable(key), MemoryBudget::format_bytes(it->second.size()),
        MemoryBudget::format_bytes(max_reply_bytes), budget_phrase()));
  }
  return get_locked(key);
}

std::string Backend::get_locked(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? std::string() : it->second;
}

int64_t Backend::add(const std::string& key, int64_t delta, Admit admit) {
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
  std::string text = std::to_string(result);
  admit_growth(set_growth(key, text.size()), admit,
               [&] { return fmt::format("ADD on key {}", printable(key)); });
  set_locked(key, std::move(text));
  return result;
}

bool Backend::check(const std::vector<std::string>& keys) const {
  const std::lock_guard<std::mutex> lock(mu_);
  return std::all_of(keys.begin(), keys.end(), [this](const auto& k) { return present(k); });
}

namespace {
/// `key` is under `prefix` as written, or with the '/' torch's TCPStore client (1.13 - 2.11)
/// puts before every key it sends.
bool under_prefix(std::string_view key, std::string_view prefix) {
  if (key.starts_with('/') && !prefix.starts_with('/')) key.remove_prefix(1);
  return key.starts_with(prefix);
}
}  // namespace

bool Backend::wait(ConnectionId conn, const std::vector<std::string>& keys, Admit admit) {
  const std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    if (!present(k)) missing.push_back(k);
  }
  if (missing.empty()) return true;
  for (const auto& k : missing)
    for (const auto& p : abandoned_)
      if (under_prefix(k, p))
        throw StoreError(fmt::format(
            "WAIT for key {}, which will never be written: gpurun abandoned the keys under {} "
            "(a rank died in that generation's set-up)",
            printable(k), printable(p)));
  std::size_t& registered = registrations_by_conn_[conn];
  if (registered + missing.size() > limits_.max_pending_waits_per_connection) {
    const std::size_t had = registered;
    if (had == 0) registrations_by_conn_.erase(conn);
    throw StoreError(fmt::format(
        "WAIT on {} missing key(s) with {} already pending exceeds the limit of {} pending "
        "wait registrations per connection",
        missing.size(), had, limits_.max_pending_waits_per_connection));
  }
  std::size_t bytes = kNodeBytes + sizeof(PendingWait) + sizeof(WaitId);
  std::size_t key_bytes = 0;
  for (const auto& k : missing) {
    bytes += wait_key_bytes(k.size());
    key_bytes += k.size();
  }
  try {
    grow(bytes, admit, [&] {
      return fmt::format("WAIT on {} missing key(s) of {} in all", missing.size(),
                         MemoryBudget::format_bytes(key_bytes));
    });
  } catch (const StoreError&) {
    if (registered == 0) registrations_by_conn_.erase(conn);
    throw;
  }
  registered += missing.size();
  const WaitId id = next_wait_id_++;
  for (const auto& k : missing) waiters_by_key_[k].push_back(id);
  waits_by_conn_[conn].push_back(id);
  waits_.emplace(id, PendingWait{conn, missing.size(), std::move(missing), bytes});
  return false;
}

void Backend::abandon_prefix(const std::string& prefix) {
  const std::lock_guard<std::mutex> lock(mu_);
  if (std::find(abandoned_.begin(), abandoned_.end(), prefix) == abandoned_.end())
    abandoned_.push_back(prefix);
  std::vector<WaitId> done;
  for (const auto& [id, w] : waits_)
    if (std::any_of(w.keys.begin(), w.keys.end(),
                    [&](const std::string& k) { return under_prefix(k, prefix); }))
      done.push_back(id);
  for (WaitId id : done) {
    const PendingWait& w = waits_.at(id);
    const ConnectionId conn = w.conn;
    unlink_keys_locked(id, w);  // its registrations go, as a CANCEL_WAIT would drop them
    auto reg = registrations_by_conn_.find(conn);
    if (reg != registrations_by_conn_.end()) {
      reg->second -= std::min(reg->second, w.remaining);
      if (reg->second == 0) registrations_by_conn_.erase(reg);
    }
    forget(id);
    if (close_) {
      close_(conn,
             fmt::format("its WAIT was for keys under {}, which will never be written: gpurun "
                         "abandoned them (a rank died in that generation's set-up)",
                         printable(prefix)));
    } else if (notify_) {
      notify_(conn);
    }
  }
}

void Backend::set_close_connection(CloseConnection close) {
  const std::lock_guard<std::mutex> lock(mu_);
  close_ = std::move(close);
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
  shrink(it->second.charged_bytes);
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

void Backend::bind_live(ConnectionId conn, const std::string& key) {
  const std::lock_guard<std::mutex> lock(mu_);
  if (key.rfind(kLivePrefix, 0) != 0) return;
  live_owner_[key] = conn;
}

void Backend::drop_connection(ConnectionId conn) {
  const std::lock_guard<std::mutex> lock(mu_);
  cancel_waits_locked(conn);
  std::vector<std::string> released;
  for (auto it = live_owner_.begin(); it != live_owner_.end();) {
    if (it->second != conn) {
      ++it;
      continue;
    }
    released.push_back(it->first);
    it = live_owner_.erase(it);
  }
  if (released.empty()) return;
  const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  for (const std::string& key : released) {
    if (auto kv = kv_.find(key); kv != kv_.end()) {
      shrink(kv_entry_bytes(kv->first.size(), kv->second.size()));
      kv_.erase(kv);
    }
    const std::string lost = std::string(kLostPrefix) + key.substr(kLivePrefix.size());
    set_locked(lost, std::to_string(now_ms));  // wakes its waiters and the observer
  }
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
      unlink_keys_locked(id, w->second);
      shrink(w->second.charged_bytes);
      waits_.erase(w);
    }
    waits_by_conn_.erase(conn_it);
  }
  registrations_by_conn_.erase(conn);
}

void Backend::unlink_keys_locked(WaitId id, const PendingWait& w) {
  for (const auto& k : w.keys) {
    auto kit = waiters_by_key_.find(k);
    if (kit == waiters_by_key_.end()) continue;
    std::erase(kit->second, id);
    if (kit->second.empty()) waiters_by_key_.erase(kit);
  }
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
  auto it = kv_.find(key);
  if (it == kv_.end()) return false;
  shrink(kv_entry_bytes(key.size(), it->second.size()));
  kv_.erase(it);
  return true;
}

void Backend::append(const std::string& key, std::string_view value, Admit admit) {
  const std::lock_guard<std::mutex> lock(mu_);
  auto it = kv_.find(key);
  const std::size_t old_size = it == kv_.end() ? 0 : it->second.size();
  grow(set_growth(key, old_size + value.size()), admit, [&] {
    return fmt::format("APPEND of {} to key {} (now {})", MemoryBudget::format_bytes(value.size()),
                       printable(key), MemoryBudget::format_bytes(old_size));
  });
  kv_[key].append(value);
  wake_all(key);
}

std::vector<std::string> Backend::multi_get(const std::vector<std::string>& keys,
                                            std::size_t max_reply_bytes) const {
  const std::lock_guard<std::mutex> lock(mu_);
  if (max_reply_bytes != SIZE_MAX) {
    std::size_t reply_bytes = 0;
    for (const auto& k : keys) {
      auto it = kv_.find(k);
      reply_bytes += 8 + (it == kv_.end() ? 0 : it->second.size());
    }
    if (reply_bytes > max_reply_bytes) {
      throw StoreError(fmt::format(
          "MULTI_GET request: its reply for {} key(s), {}, exceeds the {} that replies may "
          "still use of {}",
          keys.size(), MemoryBudget::format_bytes(reply_bytes),
          MemoryBudget::format_bytes(max_reply_bytes), budget_phrase()));
    }
  }
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(get_locked(k));
  return out;
}

void Backend::multi_set(const std::vector<std::string>& keys, std::vector<std::string> values,
                        Admit admit) {
  GPURUN_CHECK(keys.size() == values.size(), "MULTI_SET with {} keys and {} values", keys.size(),
               values.size());
  const std::lock_guard<std::mutex> lock(mu_);
  if (admit == Admit::kWithinBudget && budget_ != nullptr) {
    // Growth against the current map (a key repeated in the request is counted each time).
    std::size_t growth = 0;
    std::size_t value_bytes = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      growth += set_growth(keys[i], values[i].size());
      value_bytes += values[i].size();
    }
    admit_growth(growth, admit, [&] {
      return fmt::format("MULTI_SET of {} key(s) with {} of values", keys.size(),
                         MemoryBudget::format_bytes(value_bytes));
    });
  }
  for (std::size_t i = 0; i < keys.size(); ++i) set_locked(keys[i], std::move(values[i]));
}

void Backend::queue_push(const std::string& key, std::string value, Admit admit) {
  const std::lock_guard<std::mutex> lock(mu_);
  auto it = queues_.find(key);
  const std::size_t bytes =
      string_bytes(value.size()) + (it == queues_.end() ? queue_bytes(key.size()) : 0);
  grow(bytes, admit, [&] {
    return fmt::format("QUEUE_PUSH to key {} of a value of {}", printable(key),
                       MemoryBudget::format_bytes(value.size()));
  });
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
  shrink(string_bytes(head.size()));
  if (it->second.empty()) {
    shrink(queue_bytes(key.size()));
    queues_.erase(it);
  }
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
  std::size_t dropped = 0;
  for (const auto& entry : kv_) {
    if (drop(entry)) dropped += kv_entry_bytes(entry.first.size(), entry.second.size());
  }
  for (const auto& entry : queues_) {
    if (!drop(entry)) continue;
    dropped += queue_bytes(entry.first.size());
    for (const auto& v : entry.second) dropped += string_bytes(v.size());
  }
  std::erase_if(kv_, drop);
  std::erase_if(queues_, drop);
  shrink(dropped);
  abandoned_.clear();
}

std::size_t Backend::pending_waits(ConnectionId conn) const {
  const std::lock_guard<std::mutex> lock(mu_);
  auto it = registrations_by_conn_.find(conn);
  return it == registrations_by_conn_.end() ? 0 : it->second;
}

}  // namespace gpurun::store
