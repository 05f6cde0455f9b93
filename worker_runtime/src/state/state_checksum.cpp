#include "state/state_checksum.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include <ATen/Parallel.h>

#include "gpurun/check.hpp"

namespace gpurun::rt {
namespace {

// Folds `value` into `h`, order-dependently.
uint64_t fold(uint64_t h, uint64_t value) {
  return splitmix64(h ^ splitmix64(value));
}

// The tensor's raw bytes as int32 words, zero-padded to whole words (bool, int8, an odd count
// of halfs).
at::Tensor words_of(const at::Tensor& t) {
  at::Tensor bytes = t.contiguous().reshape({-1}).view(at::kByte);
  const int64_t pad = (4 - bytes.numel() % 4) % 4;
  if (pad != 0) bytes = at::cat({bytes, at::zeros({pad}, bytes.options())});
  return bytes.view(at::kInt);
}

// Words per piece of the CPU loop: the unit of work of one thread (16 MiB of state).
constexpr int64_t kPieceWords = int64_t{1} << 22;

// S and Σ (j+1)·w_j (j from 0 within the piece) of the `nbytes` bytes at `p` read as native
// int32 words, sign-extended, the last one zero-padded; modulo 2^64. `p` need not be aligned.
std::pair<uint64_t, uint64_t> loop_sums(const unsigned char* p, int64_t nbytes) {
  const int64_t n = nbytes / 4;
  uint64_t s = 0, w = 0;
  for (int64_t i = 0; i < n; ++i) {
    int32_t x;
    std::memcpy(&x, p + 4 * i, 4);
    const auto v = static_cast<uint64_t>(static_cast<int64_t>(x));
    s += v;
    w += static_cast<uint64_t>(i + 1) * v;
  }
  if (const int64_t rest = nbytes - 4 * n; rest > 0) {  // the zero-padded last word
    unsigned char last[4] = {0, 0, 0, 0};
    std::memcpy(last, p + 4 * n, static_cast<size_t>(rest));
    int32_t x;
    std::memcpy(&x, last, 4);
    const auto v = static_cast<uint64_t>(static_cast<int64_t>(x));
    s += v;
    w += static_cast<uint64_t>(n + 1) * v;
  }
  return {s, w};
}

}  // namespace

std::vector<std::pair<uint64_t, uint64_t>> cpu_word_sums(const std::vector<at::Tensor>& ts) {
  struct Piece {
    size_t tensor;
    int64_t first_word;  // in its tensor
    int64_t nbytes;      // > 0
  };
  std::vector<at::Tensor> host(ts.size());
  std::vector<Piece> pieces;
  for (size_t i = 0; i < ts.size(); ++i) {
    const at::Tensor& t = ts[i];
    GPURUN_CHECK(t.device().is_cpu(), "cpu_word_sums: tensor {} is on {}, not the CPU", i,
                 t.device().str());
    if (t.numel() == 0) continue;
    host[i] = t.contiguous();  // a copy only where t is not contiguous
    const auto nbytes = static_cast<int64_t>(host[i].nbytes());
    for (int64_t off = 0; off < nbytes; off += 4 * kPieceWords)
      pieces.push_back({i, off / 4, std::min(4 * kPieceWords, nbytes - off)});
  }
  std::vector<std::pair<uint64_t, uint64_t>> part(pieces.size());
  // Each piece writes its own entry; the combine below is in piece order (and exact anyway).
  at::parallel_for(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const Piece& pc = pieces[static_cast<size_t>(k)];
      const auto* base = static_cast<const unsigned char*>(host[pc.tensor].data_ptr());
      part[static_cast<size_t>(k)] = loop_sums(base + 4 * pc.first_word, pc.nbytes);
    }
  });
  std::vector<std::pair<uint64_t, uint64_t>> sums(ts.size(), {0, 0});
  for (size_t k = 0; k < pieces.size(); ++k) {
    auto& [s, p] = sums[pieces[k].tensor];
    const auto [ps, pw] = part[k];
    s += ps;
    p += pw + static_cast<uint64_t>(pieces[k].first_word) * ps;  // Σ (k+j+1)·w = Σ (j+1)·w + k·S
  }
  return sums;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

StateChecksum::StateChecksum(int64_t chunk_words, CpuSums cpu)
    : chunk_words_(chunk_words), cpu_(cpu) {
  GPURUN_CHECK(chunk_words > 0, "StateChecksum: chunk_words must be > 0, got {}", chunk_words);
}

void StateChecksum::add_tensor(const at::Tensor& t) {
  TensorEntry entry;
  entry.meta.push_back(static_cast<uint64_t>(t.dim()));
  for (int64_t s : t.sizes()) entry.meta.push_back(static_cast<uint64_t>(s));
  entry.meta.push_back(fnv1a64(c10::toString(t.scalar_type())));
  if (t.numel() > 0) {
    if (t.device().is_cpu() && cpu_ == CpuSums::kLoop) {
      entry.host = t;
    } else {
      entry.words = words_of(t);
    }
  }
  tensors_.push_back(std::move(entry));
}

std::pair<uint64_t, uint64_t> reference_sums(const at::Tensor& t) {
  if (t.numel() == 0) return {0, 0};
  const at::Tensor words = words_of(t);
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(t.device());
  const at::Tensor w = words.to(at::kLong);
  const int64_t n = w.numel();
  const int64_t plain = w.sum().item<int64_t>();
  const int64_t weighted = (w * at::arange(1, n + 1, long_opts)).sum().item<int64_t>();
  return {static_cast<uint64_t>(plain), static_cast<uint64_t>(weighted)};
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

std::vector<std::pair<uint64_t, uint64_t>> StateChecksum::tensor_sums() const {
  const size_t n = tensors_.size();
  std::vector<std::pair<uint64_t, uint64_t>> sums(n, {0, 0});
  std::vector<bool> done(n, false);
  {  // CPU tensors: one plain pass over their bytes
    std::vector<at::Tensor> host;
    std::vector<size_t> index;
    for (size_t i = 0; i < n; ++i) {
      if (!tensors_[i].host.defined()) continue;
      host.push_back(tensors_[i].host);
      index.push_back(i);
      done[i] = true;
    }
    if (!host.empty()) {
      const auto got = cpu_word_sums(host);
      for (size_t j = 0; j < index.size(); ++j) sums[index[j]] = got[j];
    }
  }
  struct Piece {
    size_t tensor;   // index into tensors_
    int64_t offset;  // first word of the piece in its tensor
    int64_t len;     // words, > 0
    int64_t begin;   // first word of the piece in its chunk
  };
  for (size_t first = 0; first < n; ++first) {
    if (done[first]) continue;
    if (!tensors_[first].words.defined()) {  // no words: S = P = 0
      done[first] = true;
      continue;
    }
    const at::Device device = tensors_[first].words.device();
    // Pack this device's tensors, in order, into chunks of at most chunk_words_ words.
    std::vector<std::vector<Piece>> chunks(1);
    int64_t fill = 0;
    for (size_t i = first; i < n; ++i) {
      const at::Tensor& w = tensors_[i].words;
      if (done[i] || !w.defined() || w.device() != device) continue;
      done[i] = true;
      for (int64_t off = 0, total = w.numel(); off < total;) {
        if (fill == chunk_words_) chunks.emplace_back(), fill = 0;
        const int64_t len = std::min(chunk_words_ - fill, total - off);
        chunks.back().push_back({i, off, len, fill});
        fill += len;
        off += len;
      }
    }
    // Per chunk, on the device: C1 = cumsum(w), C2 = cumsum(C1) (int64, wrapping like the
    // sums they stand for), and the four entries per piece that the host needs:
    // C1[b-1], C1[e-1], C2[b-1], C2[e-2] (an index of -1 reads entry 0 and is zeroed below).
    const auto long_cpu = at::TensorOptions().dtype(at::kLong);
    std::vector<at::Tensor> gathered;
    for (const auto& chunk : chunks) {
      std::vector<at::Tensor> parts;
      std::vector<int64_t> i1, i2;
      for (const Piece& p : chunk) {
        parts.push_back(tensors_[p.tensor].words.slice(0, p.offset, p.offset + p.len));
        const int64_t e = p.begin + p.len;
        i1.push_back(std::max<int64_t>(p.begin - 1, 0));
        i1.push_back(e - 1);
        i2.push_back(std::max<int64_t>(p.begin - 1, 0));
        i2.push_back(std::max<int64_t>(e - 2, 0));
      }
      const at::Tensor flat = parts.size() == 1 ? parts.front() : at::cat(parts);
      const at::Tensor c1 = at::cumsum(flat, 0, at::kLong);
      const at::Tensor c2 = at::cumsum(c1, 0);
      const auto to_dev = [&](const std::vector<int64_t>& v) {
        return at::tensor(v, long_cpu).to(device);
      };
      gathered.push_back(at::cat({c1.index_select(0, to_dev(i1)), c2.index_select(0, to_dev(i2))}));
    }
    // One device->host transfer per device.
    const at::Tensor host = at::cat(gathered).to(at::kCPU).contiguous();
    const int64_t* g = host.data_ptr<int64_t>();
    for (const auto& chunk : chunks) {
      const size_t k = chunk.size();
      for (size_t j = 0; j < k; ++j) {
        const Piece& p = chunk[j];
        const auto at = [&](size_t idx) { return static_cast<uint64_t>(g[idx]); };
        const bool starts = p.begin == 0;  // C[b-1] = 0
        const uint64_t c1b = starts ? 0 : at(2 * j);
        const uint64_t c1e = at(2 * j + 1);
        const uint64_t c2b = starts ? 0 : at(2 * k + 2 * j);
        const uint64_t c2e = p.begin + p.len - 2 < 0 ? 0 : at(2 * k + 2 * j + 1);
        const auto len = static_cast<uint64_t>(p.len);
        const uint64_t s = c1e - c1b;
        const uint64_t local = len * s - (c2e - c2b) + (len - 1) * c1b;  // Σ (i-b+1)·w_i
        sums[p.tensor].first += s;
        sums[p.tensor].second += local + static_cast<uint64_t>(p.offset) * s;
      }
      g += 4 * k;
    }
  }
  return sums;
}

uint64_t StateChecksum::finish() const {
  const std::vector<std::pair<uint64_t, uint64_t>> sums = tensor_sums();
  uint64_t h = 0x67707572756e0001ULL;  // arbitrary nonzero start
  for (size_t i = 0; i < tensors_.size(); ++i) {
    for (uint64_t m : tensors_[i].meta) h = fold(h, m);
    h = fold(h, sums[i].first);
    h = fold(h, sums[i].second);
  }
  for (uint64_t v : values_) h = fold(h, v);
  return h;
}

void warm_checksum_kernels(const at::Device& device) {
  if (!device.is_cuda()) return;
  StateChecksum warm;
  const at::Tensor odd = at::zeros({3}, at::TensorOptions().dtype(at::kByte).device(device));
  const at::Tensor even = at::zeros({2}, at::TensorOptions().dtype(at::kFloat).device(device));
  warm.add_tensor(odd);
  warm.add_tensor(even);
  (void)warm.finish();
}

}  // namespace gpurun::rt
