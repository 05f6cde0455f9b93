// gpurun::store::Backend — the store's state and semantics (KV map, per-key
// FIFO queues, pending waits), independent of any network code.
// Semantics: docs/store-protocol.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gpurun/store/frame_codec.hpp"

namespace gpurun::store {

/// Identifies one client connection to the backend (assigned by the caller).
using ConnectionId = uint64_t;

/// The store state. Thread-safe: every public member function takes one
/// internal mutex for its whole duration, so each operation is atomic and all
/// operations are totally ordered (the server's reactor threads and the
/// supervisor's elastic controller call it concurrently). Operations never
/// block beyond that mutex; a WAIT that cannot be answered at once is
/// registered, and completion is reported later through the notify callback.
class Backend {
 public:
  /// Called synchronously, with the backend's mutex held, from inside the
  /// mutating call that completed the wait (on whichever thread made that
  /// call), when a pending WAIT of `conn` is satisfied; the receiver must send
  /// STOP_WAITING (0) to that connection. One call per completed WAIT. Because
  /// the mutex is held, the receiver can queue the reply before any later
  /// operation of `conn` (e.g. its CANCEL_WAIT) is applied; it must be quick
  /// and must not call back into the backend.
  using Notify = std::function<void(ConnectionId conn)>;

  /// `limits.max_pending_waits_per_connection` bounds registrations per
  /// connection; the other limits are enforced by the frame decoder.
  explicit Backend(Limits limits = {}, Notify notify = {});

  void set_notify(Notify notify);

  /// Called synchronously after every write that wakes waiters (SET, COMPARE_SET, ADD,
  /// APPEND, each key of MULTI_SET) to a key starting with the prefix given to
  /// set_write_observer, with that key. Runs inside the mutating call, with the
  /// backend's mutex held, on the thread that made the call (any store reactor
  /// thread): the observer must be thread-safe and must not call back into the
  /// backend (post the work instead). One observer; empty = none. Once
  /// set_write_observer returns, the previous observer is no longer running
  /// and will not be called again.
  using WriteObserver = std::function<void(const std::string& key)>;
  void set_write_observer(std::string prefix, WriteObserver observer);

  /// SET: store `value` and wake waiters on `key`.
  void set(const std::string& key, std::string value);

  /// COMPARE_SET, four cases: missing+expected empty → store desired, return it;
  /// missing+expected non-empty → return expected, store nothing; present and
  /// equal → store desired, return it; present and different → return current.
  /// Wakes waiters on `key` in every case (as torch's libuv server does).
  std::string compare_set(const std::string& key, const std::string& expected, std::string desired);

  /// GET: the value, or an empty value when `key` is missing (libuv behaviour).
  std::string get(const std::string& key) const;

  /// ADD: parse the current value like C `stoll` (leading whitespace, optional
  /// sign, digits, trailing junk ignored; missing key = 0), add `delta`, store
  /// the result as decimal text, wake waiters, return it.
  /// Throws gpurun::StoreError naming the key when the current value has no
  /// leading integer, is out of int64 range, or the sum overflows int64.
  int64_t add(const std::string& key, int64_t delta);

  /// CHECK: true iff every key exists in the KV map or is a non-empty queue.
  bool check(const std::vector<std::string>& keys) const;

  /// WAIT: true if every key is present now (reply STOP_WAITING at once).
  /// Otherwise registers one wait for `conn` on each missing key and returns
  /// false; each later SET/ADD/APPEND/COMPARE_SET/MULTI_SET of one of them
  /// (or a QUEUE_PUSH that picks this wait) counts down, and at zero Notify
  /// fires once. Throws gpurun::StoreError when `conn` would exceed
  /// limits.max_pending_waits_per_connection registrations.
  bool wait(ConnectionId conn, const std::vector<std::string>& keys);

  /// CANCEL_WAIT: drops every pending wait of `conn`. The reply is always 1.
  void cancel_waits(ConnectionId conn);

  /// Connection closed: drops its pending waits.
  void drop_connection(ConnectionId conn) { cancel_waits(conn); }

  /// GETNUMKEYS: number of KV entries (queues excluded).
  int64_t num_keys() const;

  /// DELETE_KEY: true if the KV entry existed. Does not wake waiters.
  bool delete_key(const std::string& key);

  /// APPEND: concatenate to the value (create if missing); wakes waiters.
  void append(const std::string& key, std::string_view value);

  /// MULTI_GET: values in order, empty for missing keys.
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) const;

  /// MULTI_SET: SET for each pair, in order. Sizes must match (decoder guarantees).
  void multi_set(const std::vector<std::string>& keys, std::vector<std::string> values);

  /// QUEUE_PUSH: append to the FIFO of `key` (separate from the KV map) and
  /// wake at most one waiter on `key`.
  void queue_push(const std::string& key, std::string value);

  /// QUEUE_POP: returns {length before the pop, head value}; {0, nullopt} when empty.
  std::pair<int64_t, std::optional<std::string>> queue_pop(const std::string& key);

  /// QUEUE_LEN: current queue length (0 when none).
  int64_t queue_len(const std::string& key) const;

  /// LIST_KEYS: every KV key (queues excluded), unordered.
  std::vector<std::string> list_keys() const;

  /// Drops every KV key and queue whose name does not start with `keep_prefix`
  /// (between restart attempts; gpurun keeps "gpurun/"). Pending waits stay.
  void reset_keyspace(std::string_view keep_prefix);

  /// Number of key registrations `conn` has pending (0 when none).
  std::size_t pending_waits(ConnectionId conn) const;

  /// Number of pending WAIT requests over all connections.
  std::size_t num_pending_waits() const;

 private:
  using WaitId = uint64_t;
  struct PendingWait {
    ConnectionId conn;
    std::size_t remaining;          // registrations not yet counted down
    std::vector<std::string> keys;  // registered keys (with repeats)
  };

  // The helpers below expect mu_ to be held by the caller.
  void set_locked(const std::string& key, std::string value);
  std::string get_locked(const std::string& key) const;
  void cancel_waits_locked(ConnectionId conn);
  // A key was written: count down every wait registered on it.
  void wake_all(const std::string& key);
  // Count down the first wait registered on key (queue push).
  void wake_one(const std::string& key);
  void count_down(WaitId id);
  bool present(const std::string& key) const;
  void forget(WaitId id);

  // Guards every member below; held for the whole of each public call.
  mutable std::mutex mu_;
  Limits limits_;
  Notify notify_;
  std::string observer_prefix_;
  WriteObserver observer_;
  std::unordered_map<std::string, std::string> kv_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  std::unordered_map<std::string, std::deque<WaitId>> waiters_by_key_;
  std::unordered_map<WaitId, PendingWait> waits_;
  std::unordered_map<ConnectionId, std::vector<WaitId>> waits_by_conn_;
  std::unordered_map<ConnectionId, std::size_t> registrations_by_conn_;
  WaitId next_wait_id_ = 1;
};

}  // namespace gpurun::store
