// gpurun::store::ClientStore — the Store (gpurun/store/store.hpp) over one connection to a
// TCPStore (gpurun's or torch's): what a worker, a node > 0 and Gloo's rendezvous use.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpurun/store/client.hpp"
#include "gpurun/store/store.hpp"

namespace gpurun::store {

/// One connection (store::Client), opened by the constructor and closed by the destructor:
/// the store sees this process leave then (e.g. a live key's connection closing). Every call
/// is one request (get: WAIT then GET; try_get: CHECK then GET), bounded by the connection's
/// ClientOptions::timeout; get()/wait() wait for keys at most their own timeout, kNoTimeout in
/// slices of `wait_slice` (repeated until the keys appear). Thread-safe (one mutex serialises
/// the requests). Errors: as store::Client's (StoreTimeout, StoreError naming host:port; after
/// a StoreError every later call throws StoreError).
class ClientStore final : public Store {
 public:
  /// Connects (Client's constructor: retries until options.timeout; throws StoreError, or
  /// NotAStoreError when what listens is not a store).
  explicit ClientStore(ClientOptions options,
                       std::chrono::milliseconds wait_slice = std::chrono::seconds(30));

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::optional<std::string> try_get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool remove(const std::string& key) override;

  /// "host:port" of the store.
  const std::string& peer() const { return client_.peer(); }

 private:
  Client client_;
  std::chrono::milliseconds wait_slice_;
};

}  // namespace gpurun::store
