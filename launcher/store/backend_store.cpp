#include "store/backend_store.hpp"

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "gpurun/error.hpp"

namespace gpurun::store {

void BackendStore::set(const std::string& key, const std::string& value) {
  b_.set(key, value);
}

std::string BackendStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  wait({key}, timeout);
  return b_.get(key);
}

std::optional<std::string> BackendStore::try_get(const std::string& key) {
  if (!b_.check({key})) return std::nullopt;
  return b_.get(key);
}

void BackendStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  while (!b_.check(keys)) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    if (timeout != kNoTimeout && waited >= timeout)
      throw StoreTimeout(
          fmt::format("wait for keys '{}' in this process's store timed out after "
                      "{} ms (timeout {} ms)",
                      fmt::join(keys, "', '"), waited.count(), timeout.count()));
    std::this_thread::sleep_for(timeout == kNoTimeout ? poll_ : std::min(poll_, timeout - waited));
  }
}

std::string BackendStore::compare_set(const std::string& key, const std::string& expected,
                                      const std::string& desired) {
  return b_.compare_set(key, expected, desired);
}

int64_t BackendStore::add(const std::string& key, int64_t delta) {
  return b_.add(key, delta);
}

bool BackendStore::remove(const std::string& key) {
  return b_.delete_key(key);
}

void BackendStore::reset_keyspace(const std::string& keep_prefix) {
  b_.reset_keyspace(keep_prefix);
}

}  // namespace gpurun::store
