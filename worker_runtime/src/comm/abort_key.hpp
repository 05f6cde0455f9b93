// gpurun::rt::AbortKey — the supervisor's "abandon this generation's set-up" signal, as seen
// by a communicator while its rendezvous waits. gpurun writes `gpurun/gen/<g>/abort` (value: a
// sentence naming who died) when a participant of generation g dies before g is established
// (docs/control-protocol.md#failures-during-a-resize); every wait of the set-up polls it, so
// the survivors give up within about one poll interval instead of the transport timeout.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "gpurun/store/store.hpp"

namespace gpurun::rt {

struct AbortKey {
  std::string key;  ///< full store key; empty = no abort signal (static jobs, tests)
  /// How often a wait looks at the key: the longest a survivor keeps waiting after gpurun
  /// wrote it (plus one store round trip).
  std::chrono::milliseconds poll{100};

  bool empty() const { return key.empty(); }

  /// Throws CommError("<what>: abandoned by gpurun: <the key's value>") when the key exists.
  /// One try_get on `store` (a ClientStore: CHECK, + GET when set). No-op when empty().
  void throw_if_set(store::Store& store, const std::string& what) const;

  /// Store::wait for every key in `keys` up to `timeout`, in slices of `poll`, calling
  /// throw_if_set() between slices. Throws StoreTimeout after `timeout`, CommError when
  /// aborted, StoreError when the connection fails. With empty() a single wait.
  void wait(store::Store& store, const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout, const std::string& what) const;
};

}  // namespace gpurun::rt
