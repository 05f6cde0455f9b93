// gpurun::store::MemoryBudget — one byte budget for everything a store's
// clients can make the server hold: buffered keys and values (Backend),
// pending waits' key lists, replies not yet written and per-connection read
// buffers. Limits and defaults: docs/store-protocol.md ("Memory budget").
#pragma once

#include <atomic>
#include <cstddef>
#include <string>

namespace gpurun::store {

/// Default ServerOptions::memory_budget_bytes: min(physical RAM / 8, 4 GiB),
/// at least 256 MiB (also when the RAM size cannot be read). Why: the store of
/// a real job holds kilobytes to a few hundred MiB (rendezvous keys, NCCL
/// unique ids, gpurun's control keys, at most a few 8 MiB values); 4 GiB is
/// hundreds of maximal values, yet an eighth of RAM leaves the node's memory to
/// the workers, whose death an OOM kill of gpurun would cause.
std::size_t default_memory_budget_bytes();

/// A thread-safe byte counter with a ceiling (lock-free; any thread).
///
/// Charges larger than kSmallChargeBytes (a big value, a big reply, a big
/// request being received) may only use the budget up to limit - reserve
/// (reserve = limit / 8); small charges may use all of it. So when bulk data
/// exhausts the budget, short requests (a PING health probe, a rendezvous
/// key, a new connection's first read buffer) are still admitted.
class MemoryBudget {
 public:
  /// Charges up to this many bytes are "small" (see the class comment).
  static constexpr std::size_t kSmallChargeBytes = 64 * 1024;

  /// `limit_bytes` = 0 means unlimited (every try_charge succeeds).
  explicit MemoryBudget(std::size_t limit_bytes);
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  /// Adds `bytes` if the total stays within the ceiling for an item of
  /// max(bytes, item_bytes) bytes (see the class comment: pass the whole
  /// item's size when charging it in parts, e.g. a request as it arrives);
  /// returns false and changes nothing otherwise. Never blocks.
  bool try_charge(std::size_t bytes, std::size_t item_bytes = 0);
  /// Whether try_charge(bytes, item_bytes) would succeed now (no charge is made).
  bool fits(std::size_t bytes, std::size_t item_bytes = 0) const;
  /// Adds `bytes` unconditionally (memory gpurun must hold anyway, e.g. its own
  /// control keys written in-process, or a 1-byte STOP_WAITING). May exceed the
  /// limit.
  void charge(std::size_t bytes);
  /// Returns `bytes` charged before. Large releases accumulate towards trim().
  void release(std::size_t bytes);

  /// Bytes charged now.
  std::size_t used_bytes() const { return used_.load(std::memory_order_relaxed); }
  /// The highest used_bytes() seen since construction.
  std::size_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  /// The budget (0 = unlimited).
  std::size_t limit_bytes() const { return limit_; }
  /// Bytes a charge of `bytes` could still take (limit - reserve for a large
  /// charge); SIZE_MAX when unlimited.
  std::size_t available_bytes(std::size_t bytes) const;

  /// Hands freed heap memory back to the kernel (glibc malloc_trim(0)) once at
  /// least trim_after_bytes() have been released since the last trim; otherwise
  /// does nothing. Call it where no lock is held (it walks every malloc arena:
  /// about a millisecond per GiB of heap). Without it glibc keeps freed small
  /// blocks (keys of a few KiB) and, once its dynamic mmap threshold has risen,
  /// freed 8 MiB values in its arenas: the process's RSS stays at its peak
  /// after the clients that caused it have gone. Returns true if it trimmed.
  bool maybe_trim();
  /// Released bytes that trigger maybe_trim(): limit / 64, within [1 MiB, 64 MiB]
  /// (64 MiB when unlimited).
  std::size_t trim_after_bytes() const { return trim_after_; }

  /// Makes glibc hand large blocks back at once (idempotent, process-wide; no-op
  /// without glibc): blocks of 1 MiB and more are mmapped (M_MMAP_THRESHOLD)
  /// and the top of a heap is trimmed beyond 8 MiB (M_TRIM_THRESHOLD). Why:
  /// glibc's default raises its mmap threshold up to 32 MiB after the first
  /// big free, so 8 MiB values and replies then land inside thread arenas,
  /// whose free top malloc_trim() does not return: measured, 16-48 MiB stayed
  /// resident after 40 clients of 8 MiB GETs had gone. Called by Server when a
  /// budget is set; gpurun's own large allocations are the store's.
  static void tune_allocator();

  /// "N bytes (X MiB)": how the messages print sizes.
  static std::string format_bytes(std::size_t bytes);

 private:
  std::size_t ceiling(std::size_t item_bytes) const;

  const std::size_t limit_;
  const std::size_t trim_after_;
  std::atomic<std::size_t> used_{0};
  std::atomic<std::size_t> peak_{0};
  std::atomic<std::size_t> released_since_trim_{0};
};

/// The bytes one owner (a session) holds against a MemoryBudget; gives them
/// back when destroyed. Thread-safe (an atomic count), movable: no.
class MemoryCharge {
 public:
  explicit MemoryCharge(MemoryBudget& budget) : budget_(budget) {}
  ~MemoryCharge() { release_all(); }
  MemoryCharge(const MemoryCharge&) = delete;
  MemoryCharge& operator=(const MemoryCharge&) = delete;

  /// MemoryBudget::try_charge on behalf of this owner.
  bool try_add(std::size_t bytes, std::size_t item_bytes = 0);
  /// MemoryBudget::charge on behalf of this owner.
  void add(std::size_t bytes);
  /// Gives back `bytes` (at most what is held).
  void remove(std::size_t bytes);
  /// Gives back everything held.
  void release_all();
  std::size_t held_bytes() const { return held_.load(std::memory_order_relaxed); }
  MemoryBudget& budget() const { return budget_; }

 private:
  MemoryBudget& budget_;
  std::atomic<std::size_t> held_{0};
};

}  // namespace gpurun::store
