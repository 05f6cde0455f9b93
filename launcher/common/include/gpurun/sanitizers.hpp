// Which sanitizer this translation unit is built with (GPURUN_SANITIZE; scripts/test.sh's
// build-asan/, scripts/tsan.sh's build-tsan/): GCC defines __SANITIZE_ADDRESS__ and
// __SANITIZE_THREAD__, clang answers __has_feature. Code and tests that must differ under a
// sanitizer ask here, never test the compiler's macros themselves.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define GPURUN_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GPURUN_ASAN 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define GPURUN_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GPURUN_TSAN 1
#endif
#endif

namespace gpurun {

#ifdef GPURUN_ASAN
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif

#ifdef GPURUN_TSAN
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif

/// Whether this process's resident memory (VmRSS) measures what the code holds: not under
/// AddressSanitizer (its quarantine keeps freed memory resident) nor ThreadSanitizer (its shadow
/// adds several bytes per byte touched, and its allocator keeps freed memory), so RSS bounds are
/// asserted only in uninstrumented builds.
inline constexpr bool kResidentMemoryMeasurable = !kAddressSanitizer && !kThreadSanitizer;

}  // namespace gpurun
