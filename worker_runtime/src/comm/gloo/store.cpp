#include "comm/gloo/store.hpp"

#include <algorithm>
#include <utility>

namespace gpurun::rt {

GlooStore::GlooStore(std::unique_ptr<store::Store> store, std::string prefix,
                     std::chrono::milliseconds timeout, AbortKey abort)
    : store_(std::move(store)),
      prefix_(std::move(prefix)),
      timeout_(timeout),
      abort_(std::move(abort)) {}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  const std::string full = full_key(key);
  store_->set(full, std::string(data.data(), data.size()));
  if (std::find(own_keys_.begin(), own_keys_.end(), full) == own_keys_.end()) {
    own_keys_.push_back(full);
  }
}

std::vector<char> GlooStore::get(const std::string& key) {
  const std::string value = store_->get(full_key(key), timeout_);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(full_key(k));
  abort_.wait(*store_, full, timeout, "rendezvous of group '" + prefix_ + "'");
}

bool GlooStore::exists(const std::string& key) {
  return store_->try_get(full_key(key)).has_value();
}

int GlooStore::delete_own_keys() noexcept {
  int failed = 0;
  for (const auto& k : own_keys_) {
    try {
      store_->remove(k);
    } catch (...) {
      ++failed;
    }
  }
  own_keys_.clear();
  return failed;
}

}  // namespace gpurun::rt
