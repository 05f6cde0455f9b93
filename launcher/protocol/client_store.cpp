#include "gpurun/store/client_store.hpp"

#include <utility>

#include "gpurun/error.hpp"

namespace gpurun::store {

ClientStore::ClientStore(ClientOptions options, std::chrono::milliseconds wait_slice)
    : client_(std::move(options)), wait_slice_(wait_slice) {}

void ClientStore::set(const std::string& key, const std::string& value) {
  client_.set(key, value);
}

std::string ClientStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  wait({key}, timeout);
  return client_.get(key);
}

std::optional<std::string> ClientStore::try_get(const std::string& key) {
  if (!client_.check({key})) return std::nullopt;
  return client_.get(key);
}

void ClientStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  if (timeout != kNoTimeout) {
    client_.wait(keys, timeout);
    return;
  }
  while (true) {
    try {
      client_.wait(keys, wait_slice_);
      return;
    } catch (const StoreTimeout&) {
      // Keep waiting: the caller (gpurun) decides when a wait is overdue.
    }
  }
}

std::string ClientStore::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  return client_.compare_set(key, expected, desired);
}

int64_t ClientStore::add(const std::string& key, int64_t delta) {
  return client_.add(key, delta);
}

bool ClientStore::remove(const std::string& key) {
  return client_.delete_key(key);
}

}  // namespace gpurun::store
