#include "testing/memory_store.hpp"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

#include "gpurun/error.hpp"

namespace gpurun::store::testing {

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    kv_[key] = value;
  }
  changed_.notify_all();
}

void MemoryStore::wait_locked(std::unique_lock<std::mutex>& lock,
                              const std::vector<std::string>& keys,
                              std::chrono::milliseconds timeout) {
  const auto present = [&] {
    return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return kv_.count(k) != 0; });
  };
  if (timeout == kNoTimeout) {
    changed_.wait(lock, present);
    return;
  }
  if (!changed_.wait_for(lock, timeout, present))
    throw StoreTimeout(
        fmt::format("wait for keys '{}' in the in-memory store timed out after {} ms",
                    fmt::join(keys, "', '"), timeout.count()));
}

std::string MemoryStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_locked(lock, {key}, timeout);
  return kv_.at(key);
}

std::optional<std::string> MemoryStore::try_get(const std::string& key) {
  const std::lock_guard<std::mutex> lock(mu_);
  const auto it = kv_.find(key);
  if (it == kv_.end()) return std::nullopt;
  return it->second;
}

void MemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_locked(lock, keys, timeout);
}

std::string MemoryStore::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  std::string out;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    const auto it = kv_.find(key);
    if (it == kv_.end()) {
      if (!expected.empty()) return expected;
      out = kv_[key] = desired;
    } else if (it->second == expected) {
      out = it->second = desired;
    } else {
      return it->second;
    }
  }
  changed_.notify_all();
  return out;
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    std::string& text = kv_[key];
    if (!text.empty()) {
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec != std::errc() || end != text.data() + text.size())
        throw StoreError(
            fmt::format("ADD on key '{}': its value '{}' is not an integer", key, text));
    }
    if (__builtin_add_overflow(v, delta, &v))
      throw StoreError(fmt::format("ADD on key '{}': {} + {} overflows int64", key, text, delta));
    text = std::to_string(v);
  }
  changed_.notify_all();
  return v;
}

bool MemoryStore::remove(const std::string& key) {
  const std::lock_guard<std::mutex> lock(mu_);
  return kv_.erase(key) != 0;
}

void MemoryStore::reset_keyspace(const std::string& keep_prefix) {
  const std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(kv_, [&](const auto& e) { return e.first.rfind(keep_prefix, 0) != 0; });
}

std::map<std::string, std::string> MemoryStore::snapshot() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return kv_;
}

}  // namespace gpurun::store::testing
