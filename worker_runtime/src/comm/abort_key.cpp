#include "comm/abort_key.hpp"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "gpurun/error.hpp"

namespace gpurun::rt {

void AbortKey::throw_if_set(store::Store& store, const std::string& what) const {
  if (empty()) return;
  const std::optional<std::string> why = store.try_get(key);
  if (!why) return;
  throw CommError(fmt::format("{}: abandoned by gpurun: {}", what, *why));
}

void AbortKey::wait(store::Store& store, const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout, const std::string& what) const {
  if (empty()) {
    store.wait(keys, timeout);
    return;
  }
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    throw_if_set(store, what);
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const auto slice = std::clamp(left, std::chrono::milliseconds(1), poll);
    try {
      store.wait(keys, slice);
      return;
    } catch (const StoreTimeout&) {
      if (Clock::now() >= deadline) throw;
    }
  }
}

}  // namespace gpurun::rt
