// gpurun::store::Store — the one key/value store interface of gpurun's own code, shaped like
// Gloo's rendezvous::Store: the worker session (control::WorkerSession), the multi-node sync
// (supervisor::NodeSync) and Gloo's rendezvous (rt::GlooStore) all talk to a store through it.
// Implementations: ClientStore (gpurun/store/client_store.hpp: over one TCPStore connection),
// BackendStore (launcher/store/backend_store.hpp: node 0's in-process backend) and the tests'
// MemoryStore (tests/testing/memory_store.hpp). Semantics: docs/store-protocol.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gpurun::store {

/// A key/value store. Keys and values are raw bytes carried in std::string (any byte, NUL
/// included).
///
/// Blocking: only get() and wait() wait for keys, at most their `timeout` (kNoTimeout: until the
/// keys appear). Every other call returns once the store answered: at once for an in-process
/// store, after one round trip (bounded by the connection's own timeout) for a client.
///
/// Errors: gpurun::StoreTimeout when get()/wait() reach their timeout (the message names the
/// keys and the time waited); gpurun::StoreError when the store cannot answer (a client's
/// broken connection, naming host:port). A call that throws changed nothing it did not report.
///
/// Threads: every implementation gpurun ships is safe to call from several threads (a client
/// serialises its requests on one connection, so a waiting call delays the others).
class Store {
 public:
  /// get()/wait(): wait until the keys appear, however long (gpurun enforces the protocol's
  /// deadlines itself, e.g. a worker waiting for its next decision).
  static constexpr std::chrono::milliseconds kNoTimeout = std::chrono::milliseconds::max();

  virtual ~Store() = default;

  /// Stores `value` under `key` (replacing any value) and wakes every wait on `key`.
  virtual void set(const std::string& key, const std::string& value) = 0;
  /// Blocks until `key` exists (at most `timeout`), then returns its value.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  /// The value of `key`, or nullopt when it does not exist now. Does not wait for the key.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  /// Blocks until every key of `keys` exists, at most `timeout` (StoreTimeout after).
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  /// TCPStore's COMPARE_SET, atomic: `key` missing and `expected` empty, or `key` holding
  /// `expected`: stores `desired` and returns it; otherwise stores nothing and returns what
  /// `key` holds (`expected` when it is missing). compare_set(k, "", v) == v: "set if missing,
  /// and it was".
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;
  /// TCPStore's ADD, atomic: adds `delta` to the integer at `key` (missing: 0), stores the sum
  /// as decimal text and returns it. StoreError when the value is not an integer.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  /// Deletes `key`; true when it existed.
  virtual bool remove(const std::string& key) = 0;
};

/// The store this process hosts (node 0's own backend): a Store plus what only its owner may
/// do. Calls never block on keys except get()/wait().
class HostedStore : public Store {
 public:
  /// Drops every key not under `keep_prefix` (before a restart: the next attempt starts on a
  /// clean store, gpurun's own keys stay).
  virtual void reset_keyspace(const std::string& keep_prefix) = 0;
};

}  // namespace gpurun::store
