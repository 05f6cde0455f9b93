#include "gpurun/control/heartbeat.hpp"

#include <algorithm>
#include <utility>

namespace gpurun::control {

std::chrono::milliseconds heartbeat_interval(std::chrono::milliseconds node_timeout) {
  using std::chrono::milliseconds;
  if (node_timeout.count() <= 0) return milliseconds(1000);
  return std::clamp(node_timeout / 5, milliseconds(10), milliseconds(1000));
}

void HeartbeatWatch::watch(int node, Ms now) {
  nodes_[node] = Beat{std::string(), now};
}

void HeartbeatWatch::seen(int node, const std::string& value, Ms now) {
  const auto it = nodes_.find(node);
  if (it == nodes_.end()) {
    nodes_[node] = Beat{value, now};
    return;
  }
  if (it->second.value == value) return;
  it->second.value = value;
  it->second.changed = now;
}

std::optional<HeartbeatWatch::Ms> HeartbeatWatch::overdue(int node, Ms now) const {
  if (timeout_.count() <= 0) return std::nullopt;
  const auto it = nodes_.find(node);
  if (it == nodes_.end()) return std::nullopt;
  const Ms silent = now - it->second.changed;
  if (silent < timeout_) return std::nullopt;
  return silent;
}

std::optional<HeartbeatWatch::Ms> HeartbeatWatch::checked(Ms now) {
  const std::optional<Ms> last = std::exchange(last_check_, now);
  if (!last || timeout_.count() <= 0 || now - *last <= timeout_ / 2) return std::nullopt;
  for (auto& node_beat : nodes_) node_beat.second.changed = now;
  return now - *last;
}

}  // namespace gpurun::control
