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
#include "gpurun/store/live_keys.hpp"
#include "store/memory_budget.hpp"

namespace gpurun::store {

/// Identifies one client connection to the backend (assigned by the caller).
using ConnectionId = uint64_t;

/// Whether a write that makes the backend hold more memory may be refused.
/// kAlways: never refused (gpurun's own in-process writes; charged anyway, so
/// the budget may be exceeded by them). kWithinBudget: throws
/// gpurun::StoreError, changing nothing, when the growth does not fit the
/// MemoryBudget (a client's request; the server closes that connection).
enum class Admit : uint8_t { kAlways, kWithinBudget };

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

  /// Releases what it holds from the budget (see set_memory_budget).
  ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  void set_notify(Notify notify);

  /// Called, with the backend's mutex held, for each connection whose pending WAIT
  /// abandon_prefix() ended: the receiver closes that connection (asynchronously; it must not
  /// call back into the backend from inside this call). Unset: Notify is called instead.
  using CloseConnection = std::function<void(ConnectionId conn, const std::string& reason)>;
  void set_close_connection(CloseConnection close);

  /// Charges every byte the backend holds (keys and values of the KV map and
  /// the queues, pending waits' key lists; payload plus a fixed per-entry
  /// estimate of the containers' overhead, see stored_bytes()) to `budget`,
  /// which must outlive the Backend; writes with Admit::kWithinBudget are
  /// refused when they do not fit. nullptr = no budget (the default: nothing
  /// is refused, stored_bytes() still counts). Call before any other use.
  void set_memory_budget(MemoryBudget* budget);

  /// Bytes the backend holds by its own accounting: for a KV entry its key and
  /// value plus ~32 bytes of node and, per string over 15 bytes, 33 bytes of
  /// string header (std::string's inline buffer holds shorter ones); a queue:
  /// its key and ~700 bytes of deque, plus each element; a pending WAIT: each
  /// missing key twice (its wait's list, the per-key index) plus ~700 bytes per
  /// key of index. What glibc's allocator adds beyond that is not counted.
  std::size_t stored_bytes() const;

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
  /// Throws gpurun::StoreError (nothing stored) if `admit` is kWithinBudget and
  /// the growth does not fit the budget; the same holds for every write below
  /// that takes an Admit.
  void set(const std::string& key, std::string value, Admit admit = Admit::kAlways);

  /// COMPARE_SET, four cases: missing+expected empty → store desired, return it;
  /// missing+expected non-empty → return expected, store nothing; present and
  /// equal → store desired, return it; present and different → return current.
  /// Wakes waiters on `key` in every case (as torch's libuv server does).
  std::string compare_set(const std::string& key, const std::string& expected, std::string desired,
                          Admit admit = Admit::kAlways);

  /// GET: the value, or an empty value when `key` is missing (libuv behaviour).
  /// Throws gpurun::StoreError, copying nothing, when the value is longer than
  /// `max_reply_bytes` (what the budget can still take for the reply).
  std::string get(const std::string& key, std::size_t max_reply_bytes = SIZE_MAX) const;

  /// ADD: parse the current value like C `stoll` (leading whitespace, optional
  /// sign, digits, trailing junk ignored; missing key = 0), add `delta`, store
  /// the result as decimal text, wake waiters, return it.
  /// Throws gpurun::StoreError naming the key when the current value has no
  /// leading integer, is out of int64 range, or the sum overflows int64.
  int64_t add(const std::string& key, int64_t delta, Admit admit = Admit::kAlways);

  /// CHECK: true iff every key exists in the KV map or is a non-empty queue.
  bool check(const std::vector<std::string>& keys) const;

  /// WAIT: true if every key is present now (reply STOP_WAITING at once).
  /// Otherwise registers one wait for `conn` on each missing key and returns
  /// false; each later SET/ADD/APPEND/COMPARE_SET/MULTI_SET of one of them
  /// (or a QUEUE_PUSH that picks this wait) counts down, and at zero Notify
  /// fires once. Throws gpurun::StoreError when `conn` would exceed
  /// limits.max_pending_waits_per_connection registrations, or (kWithinBudget)
  /// when the registrations' memory does not fit the budget.
  bool wait(ConnectionId conn, const std::vector<std::string>& keys, Admit admit = Admit::kAlways);

  /// CANCEL_WAIT: drops every pending wait of `conn`. The reply is always 1.
  void cancel_waits(ConnectionId conn);

  /// Keys under `prefix` will never be written: gpurun abandoned a generation's set-up (a
  /// rank died in it), and a rendezvous that is not gpurun's own (torch's init_process_group,
  /// gloo's connectFullMesh) may wait there for the dead rank's address, bounded only by its
  /// timeout. Every connection with a pending WAIT on such a key is closed now
  /// (CloseConnection), and a later WAIT on a missing key under `prefix` throws StoreError,
  /// which closes that connection too: the waiting rank's store call fails at once
  /// ("connection reset by peer") and it reports to gpurun. Until
  /// reset_keyspace(). A key is under `prefix` also with one '/' before it (torch's TCPStore
  /// client sends every key so).
  void abandon_prefix(const std::string& prefix);

  /// gpurun's liveness keys (docs/store-protocol.md#liveness-keys), an extension torch's
  /// clients never touch: a client's SET of a key `gpurun/live/<name>` binds that key to the
  /// client's connection (the session calls bind_live after the SET); when the connection
  /// closes, the key is deleted and `gpurun/lost/<name>` is SET to the close time in Unix
  /// milliseconds (decimal text), waking its waiters. A node's gpurun that dies (even by
  /// SIGKILL: the kernel closes its socket) is seen this way at once. A later SET of the
  /// same live key by another connection moves the binding there.
  /// Binds the live key `key` (which must start with kLivePrefix) to `conn`.
  void bind_live(ConnectionId conn, const std::string& key);

  /// Connection closed: drops its pending waits and releases its live keys (see
  /// bind_live: each becomes a `gpurun/lost/<name>` key).
  void drop_connection(ConnectionId conn);

  /// GETNUMKEYS: number of KV entries (queues excluded).
  int64_t num_keys() const;

  /// DELETE_KEY: true if the KV entry existed. Does not wake waiters.
  bool delete_key(const std::string& key);

  /// APPEND: concatenate to the value (create if missing); wakes waiters.
  void append(const std::string& key, std::string_view value, Admit admit = Admit::kAlways);

  /// MULTI_GET: values in order, empty for missing keys. Throws
  /// gpurun::StoreError, copying nothing, when the values and their 8-byte
  /// length prefixes sum to more than `max_reply_bytes` (a MULTI_GET may name
  /// one 8 MiB value 131072 times: a 1 TiB reply).
  std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                     std::size_t max_reply_bytes = SIZE_MAX) const;

  /// MULTI_SET: SET for each pair, in order. Sizes must match (decoder guarantees).
  void multi_set(const std::vector<std::string>& keys, std::vector<std::string> values,
                 Admit admit = Admit::kAlways);

  /// QUEUE_PUSH: append to the FIFO of `key` (separate from the KV map) and
  /// wake at most one waiter on `key`.
  void queue_push(const std::string& key, std::string value, Admit admit = Admit::kAlways);

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
    std::size_t charged_bytes;      // stored_bytes_ held for it, released by forget()
  };

  // The helpers below expect mu_ to be held by the caller.
  void set_locked(const std::string& key, std::string value);
  // Accounts `bytes` more held memory; with kWithinBudget first throws StoreError (what() + the
  // budget's numbers) when they do not fit. `what` describes the request.
  template <class What>
  void grow(std::size_t bytes, Admit admit, What what);
  // The check alone (throws or returns; accounts nothing).
  template <class What>
  void admit_growth(std::size_t bytes, Admit admit, What what) const;
  void shrink(std::size_t bytes);
  // stored_bytes_ growth of SET key=value (0 when it shrinks).
  std::size_t set_growth(const std::string& key, std::size_t new_value_bytes) const;
  // "the store's memory budget of N bytes (U in use)", for refusal messages.
  std::string budget_phrase() const;
  std::string get_locked(const std::string& key) const;
  void cancel_waits_locked(ConnectionId conn);
  // Removes wait `id` from the per-key waiter lists of its keys.
  void unlink_keys_locked(WaitId id, const PendingWait& w);
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
  CloseConnection close_;
  std::string observer_prefix_;
  WriteObserver observer_;
  std::unordered_map<std::string, std::string> kv_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  std::unordered_map<std::string, std::deque<WaitId>> waiters_by_key_;
  std::unordered_map<WaitId, PendingWait> waits_;
  std::unordered_map<ConnectionId, std::vector<WaitId>> waits_by_conn_;
  std::unordered_map<ConnectionId, std::size_t> registrations_by_conn_;
  std::unordered_map<std::string, ConnectionId> live_owner_;  // live key -> its connection
  std::vector<std::string> abandoned_;                        // abandon_prefix()
  WaitId next_wait_id_ = 1;
  MemoryBudget* budget_ = nullptr;
  std::size_t stored_bytes_ = 0;
};

}  // namespace gpurun::store
