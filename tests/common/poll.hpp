// gpurun::testing::poll_until — the one polling wait of the C++ tests: for what another thread
// or process does, with a deadline (never as a timing tolerance of the code under test).
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace gpurun::testing {

/// Evaluates `pred` every `every` until it holds (true) or `limit` has passed (false, after a
/// last look); `limit` 0: one look. Blocks the calling thread; the only sleep a test needs to
/// wait for another thread or process.
inline bool poll_until(const std::function<bool()>& pred, std::chrono::milliseconds limit,
                       std::chrono::milliseconds every = std::chrono::milliseconds(10)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (pred()) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(every);
  }
}

}  // namespace gpurun::testing
