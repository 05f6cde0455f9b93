// gpurun::store::BackendStore — the Store (gpurun/store/store.hpp) over the Backend this
// process hosts (node 0's store, in process): what node 0's multi-node sync uses.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpurun/store/store.hpp"
#include "store/backend.hpp"

namespace gpurun::store {

/// Calls go straight to the Backend (its mutex only): none blocks, except get()/wait(), which
/// look at the keys every `poll` until they exist or the timeout passes (StoreTimeout). Writes
/// are gpurun's own (Admit::kAlways: never refused by the memory budget). Thread-safe, as the
/// Backend is. The Backend must outlive this.
class BackendStore final : public HostedStore {
 public:
  explicit BackendStore(Backend& backend,
                        std::chrono::milliseconds poll = std::chrono::milliseconds(10))
      : b_(backend), poll_(poll) {}

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::optional<std::string> try_get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool remove(const std::string& key) override;
  void reset_keyspace(const std::string& keep_prefix) override;

 private:
  Backend& b_;
  std::chrono::milliseconds poll_;
};

}  // namespace gpurun::store
