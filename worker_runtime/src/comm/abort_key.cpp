#include "comm/abort_key.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "gpurun/error.hpp"

namespace gpurun::rt {

void AbortKey::throw_if_set(store::Client& client, const std::string& what) const {
  if (empty() || !client.check({key})) return;
  throw CommError(fmt::format("{}: abandoned by gpurun: {}", what, client.get(key)));
}

void AbortKey::wait(store::Client& client, const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout, const std::string& what) const {
  if (empty()) {
    client.wait(keys, timeout);
    return;
  }
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    throw_if_set(client, what);
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const auto slice = std::clamp(left, std::chrono::milliseconds(1), poll);
    try {
      client.wait(keys, slice);
      return;
    } catch (const StoreTimeout&) {
      if (Clock::now() >= deadline) throw;
    }
  }
}

}  // namespace gpurun::rt
