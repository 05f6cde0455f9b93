#include "store/memory_budget.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>

#include <fmt/format.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace gpurun::store {

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kDefaultCeilingBytes = std::size_t{4} << 30;  // 4 GiB
constexpr std::size_t kDefaultFloorBytes = std::size_t{256} << 20;  // 256 MiB

}  // namespace

std::size_t default_memory_budget_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return kDefaultFloorBytes;
  const auto ram = static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size);
  return std::clamp(ram / 8, kDefaultFloorBytes, kDefaultCeilingBytes);
}

MemoryBudget::MemoryBudget(std::size_t limit_bytes)
    : limit_(limit_bytes),
      trim_after_(limit_bytes == 0 ? 64 * kMiB : std::clamp(limit_bytes / 64, kMiB, 64 * kMiB)) {}

std::size_t MemoryBudget::ceiling(std::size_t item_bytes) const {
  if (item_bytes <= kSmallChargeBytes) return limit_;
  return limit_ - limit_ / 8;
}

bool MemoryBudget::fits(std::size_t bytes, std::size_t item_bytes) const {
  if (limit_ == 0) return true;
  const std::size_t cap = ceiling(std::max(bytes, item_bytes));
  const std::size_t used = used_.load(std::memory_order_relaxed);
  return used <= cap && bytes <= cap - used;
}

std::size_t MemoryBudget::available_bytes(std::size_t bytes) const {
  if (limit_ == 0) return std::numeric_limits<std::size_t>::max();
  const std::size_t cap = ceiling(bytes);
  const std::size_t used = used_.load(std::memory_order_relaxed);
  return used >= cap ? 0 : cap - used;
}

bool MemoryBudget::try_charge(std::size_t bytes, std::size_t item_bytes) {
  if (bytes == 0) return true;
  if (limit_ == 0) {
    charge(bytes);
    return true;
  }
  const std::size_t cap = ceiling(std::max(bytes, item_bytes));
  std::size_t used = used_.load(std::memory_order_relaxed);
  do {
    if (used > cap || bytes > cap - used) return false;
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  const std::size_t now = used + bytes;
  std::size_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  return true;
}

void MemoryBudget::charge(std::size_t bytes) {
  if (bytes == 0) return;
  const std::size_t now = used_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::size_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void MemoryBudget::release(std::size_t bytes) {
  if (bytes == 0) return;
  used_.fetch_sub(bytes, std::memory_order_relaxed);
  released_since_trim_.fetch_add(bytes, std::memory_order_relaxed);
}

bool MemoryBudget::maybe_trim() {
  std::size_t released = released_since_trim_.load(std::memory_order_relaxed);
  if (released < trim_after_) return false;
  // One caller trims; the others see the counter reset.
  if (!released_since_trim_.compare_exchange_strong(released, 0, std::memory_order_relaxed)) {
    return false;
  }
#if defined(__GLIBC__)
  ::malloc_trim(0);
  return true;
#else
  return false;
#endif
}

void MemoryBudget::tune_allocator() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    ::mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMiB));
    ::mallopt(M_TRIM_THRESHOLD, static_cast<int>(8 * kMiB));
  });
#endif
}

std::string MemoryBudget::format_bytes(std::size_t bytes) {
  if (bytes < kMiB) return fmt::format("{} bytes", bytes);
  return fmt::format("{} bytes ({:.1f} MiB)", bytes, static_cast<double>(bytes) / kMiB);
}

bool MemoryCharge::try_add(std::size_t bytes, std::size_t item_bytes) {
  if (!budget_.try_charge(bytes, item_bytes)) return false;
  held_.fetch_add(bytes, std::memory_order_relaxed);
  return true;
}

void MemoryCharge::add(std::size_t bytes) {
  budget_.charge(bytes);
  held_.fetch_add(bytes, std::memory_order_relaxed);
}

void MemoryCharge::remove(std::size_t bytes) {
  std::size_t held = held_.load(std::memory_order_relaxed);
  std::size_t take = 0;
  do {
    take = std::min(held, bytes);
  } while (!held_.compare_exchange_weak(held, held - take, std::memory_order_relaxed));
  budget_.release(take);
}

void MemoryCharge::release_all() {
  budget_.release(held_.exchange(0, std::memory_order_relaxed));
}

}  // namespace gpurun::store
