// What the state checksum's arithmetic costs on a CPU when done in one plain pass: the two sums
// per tensor that StateChecksum stands for (S = sum of the int32 words, P = sum of (i+1) * word,
// both mod 2^64; reference_sums in worker_runtime/src/state/state_checksum.cpp) over BYTES of
// state, single-threaded, three times. StateChecksum computed them with two int64 cumsums per
// 128 MiB chunk (built for GPUs); on the CPU that path was the `checksum` phase of a resize
// (docs/results.md#elastic-nodes-on-loopback: 3.8-18 s for 1.008 GB on the 2-core machine).
// CPU tensors now take this loop (cpu_word_sums, worker_runtime/src/state/state_checksum.hpp).
//
//   state_sums_probe [BYTES, default 1007910960]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const uint64_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1007910960ULL;
  std::vector<int32_t> w(bytes / 4);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<int32_t>(i * 2654435761U);
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t s = 0, p = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      const auto v = static_cast<uint64_t>(static_cast<int64_t>(w[i]));
      s += v;
      p += (i + 1) * v;
    }
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("S and P in one pass over %.3f GB: %.3f s (%.2f GB/s; S %016llx P %016llx)\n",
                static_cast<double>(bytes) / 1e9, sec, static_cast<double>(bytes) / sec / 1e9,
                static_cast<unsigned long long>(s), static_cast<unsigned long long>(p));
  }
  return 0;
}
