#include "state/state_checksum.hpp"

#include <algorithm>
#include <bit>

namespace gpurun::rt {
namespace {

// Words summed per chunk: bounds the int64 temporaries to 2 × 128 MiB per chunk.
constexpr int64_t kChunkWords = int64_t{16} << 20;

// Folds `value` into `h`, order-dependently.
uint64_t fold(uint64_t h, uint64_t value) {
  return splitmix64(h ^ splitmix64(value));
}

}  // namespace

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

void StateChecksum::add_tensor(const at::Tensor& t) {
  TensorEntry entry;
  entry.meta.push_back(static_cast<uint64_t>(t.dim()));
  for (int64_t s : t.sizes()) entry.meta.push_back(static_cast<uint64_t>(s));
  entry.meta.push_back(fnv1a64(c10::toString(t.scalar_type())));

  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(t.device());
  at::Tensor plain = at::zeros({}, long_opts);
  at::Tensor weighted = at::zeros({}, long_opts);
  if (t.numel() > 0) {
    // Raw bytes, zero-padded to whole 32-bit words (bool, int8, an odd count of halfs).
    at::Tensor bytes = t.contiguous().reshape({-1}).view(at::kByte);
    const int64_t pad = (4 - bytes.numel() % 4) % 4;
    if (pad != 0) bytes = at::cat({bytes, at::zeros({pad}, bytes.options())});
    const at::Tensor words = bytes.view(at::kInt);
    const int64_t n = words.numel();
    for (int64_t begin = 0; begin < n; begin += kChunkWords) {
      const int64_t len = std::min(kChunkWords, n - begin);
      const at::Tensor w = words.slice(0, begin, begin + len).to(at::kLong);
      plain.add_(w.sum());
      weighted.add_(w.mul_(at::arange(begin + 1, begin + len + 1, long_opts)).sum());
    }
  }
  entry.sums = at::stack({plain, weighted});
  tensors_.push_back(std::move(entry));
}

void StateChecksum::add(uint64_t value) {
  values_.push_back(value);
}

void StateChecksum::add(double value) {
  values_.push_back(std::bit_cast<uint64_t>(value));
}

void StateChecksum::add(std::string_view bytes) {
  values_.push_back(bytes.size());
  values_.push_back(fnv1a64(bytes));
}

uint64_t StateChecksum::finish() const {
  // One device->host transfer per device: stack the [2] sums of that device's tensors.
  std::vector<int64_t> sums(2 * tensors_.size());
  std::vector<bool> done(tensors_.size(), false);
  for (size_t first = 0; first < tensors_.size(); ++first) {
    if (done[first]) continue;
    const at::Device device = tensors_[first].sums.device();
    std::vector<size_t> index;
    std::vector<at::Tensor> group;
    for (size_t i = first; i < tensors_.size(); ++i) {
      if (!done[i] && tensors_[i].sums.device() == device) {
        index.push_back(i);
        group.push_back(tensors_[i].sums);
        done[i] = true;
      }
    }
    const at::Tensor host = at::stack(group).to(at::kCPU).contiguous();
    const int64_t* p = host.data_ptr<int64_t>();
    for (size_t j = 0; j < index.size(); ++j) {
      sums[2 * index[j]] = p[2 * j];
      sums[2 * index[j] + 1] = p[2 * j + 1];
    }
  }
  uint64_t h = 0x67707572756e0001ULL;  // arbitrary nonzero start
  size_t k = 0;
  for (const auto& e : tensors_) {
    for (uint64_t m : e.meta) h = fold(h, m);
    h = fold(h, static_cast<uint64_t>(sums[k++]));
    h = fold(h, static_cast<uint64_t>(sums[k++]));
  }
  for (uint64_t v : values_) h = fold(h, v);
  return h;
}

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace gpurun::rt
