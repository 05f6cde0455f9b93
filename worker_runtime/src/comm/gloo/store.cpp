#include "comm/gloo/store.hpp"

#include <algorithm>
#include <utility>

namespace gpurun::rt {

GlooStore::GlooStore(const store::ClientOptions& options, std::string prefix, AbortKey abort)
    : client_(options),
      prefix_(std::move(prefix)),
      abort_(std::move(abort)),
      timeout_(options.timeout) {}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  const std::string full = full_key(key);
  client_.set(full, std::string_view(data.data(), data.size()));
  if (std::find(own_keys_.begin(), own_keys_.end(), full) == own_keys_.end()) {
    own_keys_.push_back(full);
  }
}

std::vector<char> GlooStore::get(const std::string& key) {
  const std::string value = client_.get(full_key(key));
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
  abort_.wait(client_, full, timeout, "rendezvous of group '" + prefix_ + "'");
}

bool GlooStore::exists(const std::string& key) {
  return client_.check({full_key(key)});
}

int GlooStore::delete_own_keys() noexcept {
  int failed = 0;
  for (const auto& k : own_keys_) {
    try {
      client_.delete_key(k);
    } catch (...) {
      ++failed;
    }
  }
  own_keys_.clear();
  return failed;
}

}  // namespace gpurun::rt
