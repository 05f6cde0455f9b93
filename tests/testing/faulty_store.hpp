// gpurun::store::testing::FaultyStore — one connection to a MemoryStore whose every request first
// runs a test's fault: nothing while the link is fine, else what a real client meets (a
// StoreError once the server's process died, a StoreTimeout after the request timeout on a cut
// link). Header-only; the store itself stays shared by every connection.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpurun/store/store.hpp"
#include "testing/memory_store.hpp"

namespace gpurun::store::testing {

struct FaultyStore final : store::Store {
  MemoryStore& m;
  std::function<void()> fault;  ///< runs before every request; throws to fail it
  FaultyStore(MemoryStore& store, std::function<void()> before)
      : m(store), fault(std::move(before)) {}
  void set(const std::string& k, const std::string& v) override {
    fault();
    m.set(k, v);
  }
  std::string get(const std::string& k, std::chrono::milliseconds t) override {
    fault();
    return m.get(k, t);
  }
  std::optional<std::string> try_get(const std::string& k) override {
    fault();
    return m.try_get(k);
  }
  void wait(const std::vector<std::string>& k, std::chrono::milliseconds t) override {
    fault();
    m.wait(k, t);
  }
  std::string compare_set(const std::string& k, const std::string& e,
                          const std::string& d) override {
    fault();
    return m.compare_set(k, e, d);
  }
  int64_t add(const std::string& k, int64_t d) override {
    fault();
    return m.add(k, d);
  }
  bool remove(const std::string& k) override {
    fault();
    return m.remove(k);
  }
};

}  // namespace gpurun::store::testing
