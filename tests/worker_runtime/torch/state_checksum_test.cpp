#include "state/state_checksum.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include "gpurun/check.hpp"

namespace rt = gpurun::rt;

namespace {

using Sums = std::vector<std::pair<uint64_t, uint64_t>>;

Sums sums_of(const std::vector<at::Tensor>& ts, int64_t chunk, rt::StateChecksum::CpuSums cpu) {
  rt::StateChecksum sum(chunk, cpu);
  for (const auto& t : ts) sum.add_tensor(t);
  return sum.tensor_sums();
}

uint64_t finish_of(const std::vector<at::Tensor>& ts, rt::StateChecksum::CpuSums cpu) {
  rt::StateChecksum sum(rt::StateChecksum::kDefaultChunkWords, cpu);
  for (const auto& t : ts) sum.add_tensor(t);
  sum.add(uint64_t{7});
  return sum.finish();
}

// Every CPU allocation of tensor memory (c10's CPU allocator), counted, while it is installed.
// c10::Allocator differs between the LibTorch versions gpurun builds with: allocate() is const
// in 1.13 and not in 2.x, and 2.x adds copy_data(). Both forms are defined, without
// `override`, so that each LibTorch takes the ones it declares.
struct CountingAllocator final : c10::Allocator {
  explicit CountingAllocator(c10::Allocator* base) : base(base) {}
  c10::DataPtr allocate(size_t n) const {
    bytes += n;
    return base->allocate(n);
  }
  c10::DataPtr allocate(size_t n) {
    return static_cast<const CountingAllocator*>(this)->allocate(n);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }
  c10::DeleterFnPtr raw_deleter() const override { return base->raw_deleter(); }
  c10::Allocator* base;
  mutable std::atomic<size_t> bytes{0};
};

struct CountAllocations {
  CountAllocations() : counting(c10::GetCPUAllocator()) { c10::SetCPUAllocator(&counting, 255); }
  ~CountAllocations() { c10::SetCPUAllocator(counting.base, 255); }
  CountingAllocator counting;
};

}  // namespace

TEST_CASE("state checksum: the chunked prefix-sum form gives the direct sums of every tensor") {
  // Words that make the int64 sums wrap, signed words, dtypes whose bytes are no whole number
  // of words, an empty and a non-contiguous tensor; chunk sizes that split tensors across
  // chunks (1, 3, 7 words), pack several into one (1000) and the default.
  torch::manual_seed(3);
  std::vector<at::Tensor> ts = {
      torch::randint(INT32_MIN, INT32_MAX, {1000}, torch::kInt),
      torch::full({17}, INT32_MAX, torch::kInt),
      torch::full({23}, INT32_MIN, torch::kInt),
      torch::randn({5, 7}),
      torch::randn({3}, torch::kHalf),  // 6 bytes: the last word zero-padded
      torch::randint(0, 2, {5}, torch::kBool),
      torch::randint(-128, 127, {9}, torch::kChar),
      torch::randint(-(int64_t{1} << 62), int64_t{1} << 62, {13}, torch::kLong),
      torch::empty({0}),
      torch::randn({6, 4}).t(),  // non-contiguous
      torch::randn({1}),
      torch::randn({2048}),
  };
  std::vector<std::pair<uint64_t, uint64_t>> want;
  for (const auto& t : ts) want.push_back(rt::reference_sums(t));
  CHECK(want[1].first != 0);  // the wrapping cases are not trivially zero
  for (int64_t chunk :
       {int64_t{1}, int64_t{3}, int64_t{7}, int64_t{1000}, rt::StateChecksum::kDefaultChunkWords}) {
    CAPTURE(chunk);
    const auto got = sums_of(ts, chunk, rt::StateChecksum::CpuSums::kPrefixSums);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      CHECK(got[i] == want[i]);
    }
  }
  // The folded value depends on the sums only, not on the chunking.
  rt::StateChecksum a(3, rt::StateChecksum::CpuSums::kPrefixSums), b;
  for (const auto& t : ts) a.add_tensor(t), b.add_tensor(t);
  CHECK(a.finish() == b.finish());
  CHECK_THROWS_WITH_AS(rt::StateChecksum(0), doctest::Contains("chunk_words must be > 0"),
                       gpurun::InvariantError);
}

TEST_CASE(
    "state checksum: the CPU loop gives the prefix-sum path's value on every dtype, odd "
    "sizes and strides, with any number of threads") {
  // A joiner on the CPU compares its checksum with a source's that may have been taken on a
  // GPU by the prefix-sum path: the two must agree bit for bit. Random bytes of every dtype,
  // sizes that leave 1, 2 or 3 bytes of a last word, views that are transposed, strided or
  // start at an odd byte, and tensors longer than one piece of the loop (4 Mi words) whose
  // length is no whole number of pieces or words.
  torch::manual_seed(46);
  const auto bytes = [](int64_t n) { return torch::randint(0, 256, {n}, torch::kByte); };
  std::vector<at::Tensor> ts = {
      torch::randn({7, 5}),
      torch::randn({3, 11}, torch::kDouble),
      torch::randn({13}, torch::kHalf),
      torch::randn({5, 3}, torch::kBFloat16),
      torch::randint(-128, 127, {1}, torch::kChar),
      torch::randint(-128, 127, {1001}, torch::kChar),
      bytes(2),
      bytes(3),
      torch::randint(0, 2, {9}, torch::kBool),
      torch::randint(-30000, 30000, {7}, torch::kShort),
      torch::randint(INT32_MIN, INT32_MAX, {4099}, torch::kInt),
      torch::full({31}, INT32_MIN, torch::kInt),
      torch::randint(-(int64_t{1} << 62), int64_t{1} << 62, {17}, torch::kLong),
      torch::randn({4, 3}, torch::kComplexFloat),
      torch::empty({0}),
      torch::empty({3, 0, 2}),
      torch::tensor(2.5),                                   // 0-dim
      torch::randn({9, 6}).t(),                             // transposed
      torch::randn({40}, torch::kHalf).slice(0, 1, 40, 3),  // strided, odd start
      bytes(41).slice(0, 1, 40),                            // contiguous, starts at an odd byte
      torch::randint(INT32_MIN, INT32_MAX, {3, 1 << 21}, torch::kInt).t(),  // 6 Mi words
      bytes((int64_t{9} << 22) * 4 + 3),                                    // 9 pieces and 3 bytes
  };
  const rt::StateChecksum::CpuSums kLoop = rt::StateChecksum::CpuSums::kLoop;
  const rt::StateChecksum::CpuSums kPrefix = rt::StateChecksum::CpuSums::kPrefixSums;
  const Sums want = sums_of(ts, rt::StateChecksum::kDefaultChunkWords, kPrefix);
  for (size_t i = 0; i + 2 < ts.size(); ++i) {  // the direct form (small tensors only)
    CAPTURE(i);
    CHECK(want[i] == rt::reference_sums(ts[i]));
  }
  const uint64_t want_value = finish_of(ts, kPrefix);
  const int threads = at::get_num_threads();
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    at::set_num_threads(n);
    const Sums got = rt::cpu_word_sums(ts);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      CHECK(got[i] == want[i]);
    }
    CHECK(finish_of(ts, kLoop) == want_value);
  }
  at::set_num_threads(threads);
  // Chunking of the prefix-sum path and the loop's pieces do not meet: any chunk size agrees.
  CHECK(sums_of(ts, 1000, kLoop) == sums_of(ts, 1000, kPrefix));
}

TEST_CASE("state checksum: a CPU state's checksum allocates no tensor memory") {
  // The prefix-sum path wrote 4-5 bytes per byte of state into fresh memory (a copy and two
  // int64 prefix sums per 128 MiB chunk): 3.8-18 s per GB of a resize on the 2-core CI machine.
  torch::manual_seed(5);
  const std::vector<at::Tensor> ts = {torch::randn({1 << 20}), torch::randn({999}, torch::kHalf),
                                      torch::randint(0, 2, {5}, torch::kBool)};
  size_t loop_bytes = 0, prefix_bytes = 0;
  uint64_t loop_value = 0, prefix_value = 0;
  {
    CountAllocations count;
    loop_value = finish_of(ts, rt::StateChecksum::CpuSums::kLoop);
    loop_bytes = count.counting.bytes.load();
    count.counting.bytes = 0;
    prefix_value = finish_of(ts, rt::StateChecksum::CpuSums::kPrefixSums);
    prefix_bytes = count.counting.bytes.load();
  }
  CHECK(loop_value == prefix_value);
  CHECK(loop_bytes == 0);
  CHECK(prefix_bytes > size_t{8} << 20);  // the counter sees the other path's int64 sums
  // A non-CPU tensor is refused by the loop (the caller sends device tensors elsewhere).
  CHECK_THROWS_WITH_AS(rt::cpu_word_sums({torch::empty({2}, torch::kMeta)}),
                       doctest::Contains("not the CPU"), gpurun::InvariantError);
}
