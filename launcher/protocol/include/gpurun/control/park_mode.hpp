// gpurun::control::ParkMode — what happens to a worker taken out of the active set
// (`[park] mode` in config.toml, `park_mode` in a decision). Shared by the
// supervisor (config parser) and the worker side (decision encoding).
#pragma once

#include <string_view>

namespace gpurun::control {

/// What happens to a worker taken out of the active set (`[park] mode`).
enum class ParkMode {
  /// The process exits cleanly; its GPU shows no process of ours (0 MiB). Rejoin respawns it.
  kRelease,
  /// The process stays, blocked on the store with its CUDA context; rejoin is faster.
  kHold,
};

/// "release" or "hold" (the spelling used in config.toml and in decisions).
constexpr std::string_view to_string(ParkMode mode) {
  return mode == ParkMode::kHold ? "hold" : "release";
}

}  // namespace gpurun::control
