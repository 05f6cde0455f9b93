// gpurun::StateExtension — user state that moves with the model at a handoff (a joiner
// receives it from the state source; a pause keeps it in the host snapshot).
#pragma once

#include <string>
#include <string_view>

namespace gpurun {

/// Implement for state that is not a tensor of a tracked module or optimizer and not a
/// plain integer/double (for those use Runtime::track_scalar): e.g. an LR scheduler's
/// step count, an RNG state, a running metric. save() runs on the state source, load()
/// on every receiver, both at a boundary, on the caller's thread; the bytes are opaque
/// to gpurun (at most 64 MiB). A throwing load() fails the handoff on that rank.
class StateExtension {
 public:
  virtual ~StateExtension() = default;
  virtual std::string save() const = 0;
  virtual void load(std::string_view bytes) = 0;
};

}  // namespace gpurun
