// rt::split_at_chunks: the snapshot copies of a mapping page-locked in chunks, cut so that no
// copy spans two registrations, move the same bytes as the uncut copies.
#include "state/pin_chunks.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include <torch/torch.h>

namespace rt = gpurun::rt;

TEST_CASE("split_at_chunks: no copy spans a chunk; the groups move the same bytes") {
  constexpr size_t kChunk = 4096;
  std::vector<uint8_t> mapping(7 * kChunk, 0xEE);
  uint8_t* base = mapping.data();
  torch::manual_seed(3);
  // file order, 64-byte aligned as the format lays tensors out: one inside chunk 0, one across
  // chunks 0-3, an empty one, a bfloat16 one across 3-4, one across 4-6
  const std::vector<std::pair<at::Tensor, size_t>> at_offsets{
      {torch::randn({100}), 64},         {torch::randint(0, 1 << 30, {1500}, torch::kLong), 512},
      {torch::empty({0}), 12544},        {torch::randn({40, 60}).to(torch::kBFloat16), 12544},
      {torch::randn({2 * 1024}), 17408},
  };
  std::vector<rt::compat::HostCopy> copies;
  for (const auto& [t, off] : at_offsets) copies.push_back({t, base + off});
  const auto groups = rt::split_at_chunks(copies, base, kChunk);

  std::vector<size_t> chunk_of_group;
  for (const auto& g : groups) {
    REQUIRE(!g.empty());
    const size_t k = static_cast<size_t>(g.front().host - base) / kChunk;
    chunk_of_group.push_back(k);
    for (const auto& c : g) {
      const size_t b = static_cast<size_t>(c.host - base), e = b + c.tensor.nbytes();
      CHECK(b / kChunk == k);
      CHECK((e - 1) / kChunk == k);  // ends in the chunk it begins in
    }
    CHECK(rt::group_end(g, base) <= (k + 1) * kChunk);
  }
  CHECK(chunk_of_group == std::vector<size_t>{0, 1, 2, 3, 4, 5, 6});

  // the cut copies write exactly what the uncut ones do
  std::vector<uint8_t> want(mapping.size(), 0xEE);
  for (const auto& [t, off] : at_offsets)
    if (t.nbytes() > 0) std::memcpy(want.data() + off, t.data_ptr(), t.nbytes());
  for (const auto& g : groups) rt::compat::copy_host(g, /*to_host=*/true);
  CHECK(mapping == want);

  // and back: fresh tensors read from the mapping group by group equal the originals
  std::vector<rt::compat::HostCopy> back;
  for (const auto& [t, off] : at_offsets) back.push_back({torch::zeros_like(t), base + off});
  for (const auto& g : rt::split_at_chunks(back, base, kChunk)) rt::compat::copy_host(g, false);
  for (size_t i = 0; i < back.size(); ++i) CHECK(back[i].tensor.equal(at_offsets[i].first));

  CHECK(rt::split_at_chunks(copies, base, 0).size() == 1);  // chunk 0: one group, uncut
  CHECK(rt::split_at_chunks(copies, base, 0).front().size() == copies.size());
  std::vector<rt::compat::HostCopy> reversed(copies.rbegin(), copies.rend());
  CHECK_THROWS(rt::split_at_chunks(reversed, base, kChunk));
}
