// gpurun::rt::GlooStore — Gloo's rendezvous store interface over gpurun's store::Store (one
// dedicated store::ClientStore connection to the supervisor's TCPStore), with every key under
// a prefix. Records the keys it set so that the group can delete them once everyone has
// connected.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "comm/abort_key.hpp"
#include "gpurun/store/store.hpp"

namespace gpurun::rt {

/// Adapter used only during the rendezvous of one Gloo group. Not thread-safe: one instance
/// per rendezvous, used by the thread that runs it.
///
/// Keys: Gloo's key `k` is stored as "<prefix>/<k>". Values are raw bytes.
/// Errors: the store's gpurun::StoreError / StoreTimeout pass through Gloo unchanged
/// (GlooCommunicator turns them into CommError).
class GlooStore final : public ::gloo::rendezvous::Store {
 public:
  /// Over `store` (make_gloo_communicator: a store::ClientStore of its own, opened with
  /// `timeout`). `timeout` bounds get() and wait() without one. Every wait polls `abort`
  /// (CommError once gpurun abandoned the generation).
  GlooStore(std::unique_ptr<store::Store> store, std::string prefix,
            std::chrono::milliseconds timeout, AbortKey abort = {});

  void set(const std::string& key, const std::vector<char>& data) override;
  /// Blocks until `key` exists (up to the timeout).
  std::vector<char> get(const std::string& key) override;
  /// Blocks until every key exists, up to the timeout.
  void wait(const std::vector<std::string>& keys) override;
  /// Blocks until every key exists, up to `timeout` (StoreTimeout), or until the abort key
  /// is set (CommError).
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  /// True iff "<prefix>/<key>" exists now (does not block).
  bool exists(const std::string& key);
  /// Deletes every key this instance set. Best effort: never throws; returns how many
  /// deletions failed (connection lost).
  int delete_own_keys() noexcept;
  /// The full store keys this instance set, in order.
  const std::vector<std::string>& own_keys() const { return own_keys_; }

 private:
  std::string full_key(const std::string& key) const { return prefix_ + "/" + key; }

  std::unique_ptr<store::Store> store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;  // get() and wait() without a timeout
  AbortKey abort_;
  std::vector<std::string> own_keys_;
};

}  // namespace gpurun::rt
