// Node 0's store (the TCPStore backend gpurun hosts) as the multi-node sync sees it.
#pragma once

#include <optional>
#include <string>

#include "store/backend.hpp"
#include "supervisor/node_sync.hpp"

namespace gpurun::app {

/// Node 0's store as the multi-node sync sees it.
class BackendStore final : public supervisor::LocalStore {
 public:
  explicit BackendStore(store::Backend& b) : b_(b) {}
  std::optional<std::string> get(const std::string& key) override {
    if (!b_.check({key})) return std::nullopt;
    return b_.get(key);
  }
  void set(const std::string& key, const std::string& value) override { b_.set(key, value); }
  std::string set_if_missing(const std::string& key, const std::string& value) override {
    return b_.compare_set(key, "", value);
  }
  void reset_keyspace(const std::string& keep_prefix) override { b_.reset_keyspace(keep_prefix); }
  void remove(const std::string& key) override { b_.delete_key(key); }

 private:
  store::Backend& b_;
};

}  // namespace gpurun::app
