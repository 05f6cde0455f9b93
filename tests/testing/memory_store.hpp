// gpurun::store::testing::MemoryStore — the Store fake (gpurun/store/store.hpp): a map in
// memory with the TCPStore's semantics, for tests of code that talks to a store (Gloo's
// HashStore in gpurun's shape). Test-only (gpurun_testing).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gpurun/store/store.hpp"

namespace gpurun::store::testing {

/// Thread-safe (one mutex); get()/wait() block on a condition variable until the keys are set
/// by another thread or the timeout passes (StoreTimeout naming the keys). reset_keyspace()
/// drops the keys outside the prefix, as the backend does.
class MemoryStore final : public HostedStore {
 public:
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::optional<std::string> try_get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool remove(const std::string& key) override;
  void reset_keyspace(const std::string& keep_prefix) override;

  /// Every key and value now (tests' inspection).
  std::map<std::string, std::string> snapshot() const;

 private:
  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout);

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> kv_;
};

}  // namespace gpurun::store::testing
