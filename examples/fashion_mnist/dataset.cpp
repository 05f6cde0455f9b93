#include "fashion_mnist/dataset.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include "fashion_mnist/idx.hpp"
#include "gpurun/check.hpp"

namespace gpurun::fashion_mnist {

NormStats compute_norm_stats(const torch::Tensor& images) {
  if (images.scalar_type() != torch::kUInt8 || images.numel() == 0) {
    throw Error(
        fmt::format("compute_norm_stats: needs a non-empty uint8 tensor, got {} with {} "
                    "elements",
                    std::string(c10::toString(images.scalar_type())), images.numel()));
  }
  const auto flat = images.contiguous();
  const uint8_t* p = flat.data_ptr<uint8_t>();
  std::array<int64_t, 256> histogram{};
  const int64_t n = flat.numel();
  for (int64_t i = 0; i < n; ++i) ++histogram[p[i]];
  double sum = 0.0;
  double sum_sq = 0.0;  // exact: integers below 2^53 for any realistic n
  for (int v = 0; v < 256; ++v) {
    sum += static_cast<double>(histogram[v]) * v;
    sum_sq += static_cast<double>(histogram[v]) * v * v;
  }
  const double mean = sum / static_cast<double>(n);
  const double var = sum_sq / static_cast<double>(n) - mean * mean;
  return {mean / 255.0, std::sqrt(std::max(var, 0.0)) / 255.0};
}

namespace detail {
namespace {

Split load_split(const std::filesystem::path& dir, const char* prefix) {
  const auto images_path = dir / fmt::format("{}-images-idx3-ubyte.gz", prefix);
  const auto labels_path = dir / fmt::format("{}-labels-idx1-ubyte.gz", prefix);
  auto [images, labels] = read_idx_pair(images_path, labels_path);
  if (images.size(1) != 28 || images.size(2) != 28) {
    throw Error(fmt::format("{}: images are {}x{}, Fashion-MNIST's are 28x28", images_path.string(),
                            images.size(1), images.size(2)));
  }
  if (labels.numel() > 0) {
    const int64_t lo = labels.min().item<int64_t>();
    const int64_t hi = labels.max().item<int64_t>();
    if (lo < 0 || hi >= kNumClasses) {
      throw Error(fmt::format("{}: label {} is outside 0..{}", labels_path.string(),
                              hi >= kNumClasses ? hi : lo, kNumClasses - 1));
    }
  }
  return {std::move(images), std::move(labels)};
}

}  // namespace
}  // namespace detail

FashionMnist FashionMnist::load(const std::filesystem::path& dir) {
  FashionMnist data;
  data.train = detail::load_split(dir, "train");
  data.test = detail::load_split(dir, "t10k");
  data.stats = compute_norm_stats(data.train.images);
  return data;
}

Batch make_batch(const Split& split, const std::vector<int64_t>& indices,
                 const BatchOptions& options) {
  if (indices.empty()) throw Error("make_batch: the index list is empty");
  if (options.img_size < 1) {
    throw Error(fmt::format("make_batch: img_size {} is not a positive size", options.img_size));
  }
  const int64_t n = split.size();
  for (size_t k = 0; k < indices.size(); ++k) {
    if (indices[k] < 0 || indices[k] >= n) {
      throw Error(
          fmt::format("make_batch: index {} (position {} of {}) is outside a split of {} "
                      "samples",
                      indices[k], k, indices.size(), n));
    }
  }
  const auto idx = torch::from_blob(const_cast<int64_t*>(indices.data()),
                                    {static_cast<int64_t>(indices.size())}, torch::kInt64);
  // (p / 255 - mean) / std, as one multiply and one subtract on the float copy.
  const double scale = 1.0 / (255.0 * options.stats.std);
  const double shift = options.stats.mean / options.stats.std;
  auto images = split.images.index_select(0, idx).unsqueeze(1).to(torch::kFloat32);
  images.mul_(scale).sub_(shift);
  if (options.img_size != images.size(-1) || options.img_size != images.size(-2)) {
    namespace F = torch::nn::functional;
    auto interp = F::InterpolateFuncOptions()
                      .size(std::vector<int64_t>{options.img_size, options.img_size})
                      .align_corners(false);
    if (options.resize == ResizeMode::kBicubic) {
      interp.mode(torch::kBicubic);
    } else {
      interp.mode(torch::kBilinear);
    }
    images = F::interpolate(images, interp);
  }
  auto labels = split.labels.index_select(0, idx);
  if (options.pin_memory && at::hasCUDA()) {
    images = images.pin_memory();
    labels = labels.pin_memory();
  }
  return {std::move(images), std::move(labels)};
}

int loader_threads(int active_local_workers, unsigned hardware_threads) {
  const int hw = static_cast<int>(std::max(hardware_threads, 1u));
  const int workers = std::max(active_local_workers, 1);
  return std::max(1, (hw / 2) / workers);
}

BatchLoader::BatchLoader(size_t count, MakeFn make, BatchLoaderOptions options)
    : count_(count),
      make_(std::move(make)),
      max_ahead_(options.max_ahead > 0 ? options.max_ahead
                                       : 2 * static_cast<size_t>(std::max(options.threads, 1))) {
  if (options.threads < 1) {
    throw Error(
        fmt::format("BatchLoader: {} threads requested, at least 1 is needed", options.threads));
  }
  slots_.resize(max_ahead_);
  const size_t n = std::min(static_cast<size_t>(options.threads), count_);
  threads_.reserve(n);
  try {
    for (size_t t = 0; t < n; ++t) threads_.emplace_back([this] { work(); });
  } catch (...) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    throw;
  }
}

BatchLoader::BatchLoader(const Split& split, IndexBatches batches, BatchOptions batch_options,
                         BatchLoaderOptions options)
    : BatchLoader(split, std::make_shared<const IndexBatches>(std::move(batches)),
                  std::move(batch_options), options) {}

BatchLoader::BatchLoader(const Split& split, std::shared_ptr<const IndexBatches> batches,
                         BatchOptions batch_options, BatchLoaderOptions options)
    : BatchLoader(
          batches->size(),
          [&split, batches, batch_options](size_t i) {
            return make_batch(split, (*batches)[i], batch_options);
          },
          options) {}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void BatchLoader::work() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] {
      return stop_ || next_claim_ >= count_ || next_claim_ < consumed_ + max_ahead_;
    });
    if (stop_ || next_claim_ >= count_) return;
    const size_t i = next_claim_++;
    lock.unlock();
    Slot slot;
    try {
      slot.batch = make_(i);
    } catch (...) {
      slot.error = std::current_exception();
    }
    lock.lock();
    slots_[i % max_ahead_] = std::move(slot);
    cv_.notify_all();
  }
}

std::optional<Batch> BatchLoader::next() {
  if (failed_) std::rethrow_exception(failed_);
  std::unique_lock lock(mu_);
  if (consumed_ >= count_) return std::nullopt;
  auto& slot = slots_[consumed_ % max_ahead_];
  cv_.wait(lock, [&slot] { return slot.has_value(); });
  Slot ready = std::move(*slot);
  slot.reset();
  ++consumed_;
  if (ready.error) {
    failed_ = ready.error;
    stop_ = true;
  }
  lock.unlock();
  cv_.notify_all();
  if (failed_) std::rethrow_exception(failed_);
  return std::move(ready.batch);
}

BatchLoader::IndexBatches chunk_indices(const std::vector<int64_t>& order, int64_t batch) {
  GPURUN_CHECK(batch >= 1, "batch size {}", batch);
  BatchLoader::IndexBatches batches;
  for (size_t i = 0; i < order.size(); i += static_cast<size_t>(batch)) {
    const size_t end = std::min(order.size(), i + static_cast<size_t>(batch));
    batches.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(i),
                         order.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return batches;
}

}  // namespace gpurun::fashion_mnist
