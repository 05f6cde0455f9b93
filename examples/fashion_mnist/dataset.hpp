// Fashion-MNIST in memory, batch assembly and a prefetching batch loader.
#pragma once

#include <torch/torch.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "gpurun/error.hpp"

namespace gpurun::fashion_mnist {

/// Where Debian's image keeps the four .gz files.
inline constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";
/// Number of classes (0 T-shirt/top ... 9 ankle boot).
inline constexpr int64_t kNumClasses = 10;

/// Pixel statistics on the [0, 1] scale (pixel / 255).
struct NormStats {
  double mean = 0.0;
  double std = 1.0;  ///< population standard deviation
};

/// Statistics of the Fashion-MNIST training set: all 60000 x 28 x 28 pixels, computed exactly by
/// compute_norm_stats() (mean 0.2860405969887955, population std 0.3530242445149226). Usable
/// before the data is loaded; FashionMnist::load() recomputes them from the files it reads.
inline constexpr NormStats kTrainStats{0.2860405969887955, 0.3530242445149226};

/// Exact mean and population std of uint8 `images` (any shape) scaled to [0, 1], via a 256-bin
/// histogram (one pass, ~50 ms for the training set). Throws Error on an empty tensor or a
/// dtype other than uint8.
NormStats compute_norm_stats(const torch::Tensor& images);

/// One split in memory (CPU).
struct Split {
  torch::Tensor images;  ///< uint8 [N, 28, 28]
  torch::Tensor labels;  ///< int64 [N], values 0..9
  int64_t size() const { return labels.size(0); }
};

/// Both splits, read from `<dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz`.
struct FashionMnist {
  Split train;      ///< 60000 samples
  Split test;       ///< 10000 samples
  NormStats stats;  ///< of train.images, computed once by load()

  /// Reads the four files (~0.5 s; blocks). Throws IdxError naming the file on any defect
  /// (see idx.hpp) and Error when a label is outside 0..9 or an image is not 28x28.
  static FashionMnist load(const std::filesystem::path& dir = kDefaultDataDir);
};

/// How make_batch resizes when img_size differs from the stored 28.
enum class ResizeMode { kBilinear, kBicubic };

/// Options of make_batch.
struct BatchOptions {
  NormStats stats = kTrainStats;  ///< subtracted/divided after scaling pixels to [0, 1]
  int64_t img_size = 28;          ///< output height = width in pixels; 28 keeps the originals
  ResizeMode resize = ResizeMode::kBilinear;  ///< align_corners=false; ignored at 28
  /// Page-lock the batch so a later .to(cuda, non_blocking=true) is asynchronous. Honoured only
  /// when at::hasCUDA(); ignored (no error) on CPU-only builds.
  bool pin_memory = false;
};

/// A training or evaluation batch on the host.
struct Batch {
  torch::Tensor images;  ///< float32 [B, 1, img_size, img_size], normalised
  torch::Tensor labels;  ///< int64 [B]
};

/// Gathers split samples `indices` (in that order) into a Batch: images become
/// (pixel / 255 - mean) / std, then are resized by torch::nn::functional::interpolate when
/// img_size != 28 (normalising first is exact: bilinear and bicubic weights sum to 1).
/// Thread-safe (reads `split` only). Throws Error on an index outside [0, split.size()) or an
/// empty `indices`.
Batch make_batch(const Split& split, const std::vector<int64_t>& indices,
                 const BatchOptions& options = {});

/// Loader threads for one worker process: max(1, (hardware_concurrency / 2) /
/// active_local_workers). The rule: batch preparation gets half of the host's hardware threads
/// (the other half stays with the training threads and the framework), shared evenly by the
/// worker processes running on this host. `active_local_workers` < 1 counts as 1;
/// `hardware_threads` 0 (unknown) counts as 1.
int loader_threads(int active_local_workers,
                   unsigned hardware_threads = std::thread::hardware_concurrency());

/// Options of BatchLoader.
struct BatchLoaderOptions {
  int threads = 1;  ///< worker threads (>= 1); see loader_threads()
  /// Batches prepared or being prepared ahead of the consumer, at most; 0 means 2 * threads.
  size_t max_ahead = 0;
};

/// Prepares the batches of one epoch on worker threads ahead of the consumer and hands them
/// out in order. Workers claim batch numbers in increasing order and stop claiming while
/// `max_ahead` batches are unconsumed, so memory stays bounded. A batch whose preparation
/// throws is delivered as that exception from next(); the loader then stops, and later next()
/// calls rethrow it. The destructor stops claiming and joins every thread (it waits for batches
/// in preparation to finish).
class BatchLoader {
 public:
  /// Builds batch `i` (0 <= i < count); called on a loader thread, possibly concurrently.
  using MakeFn = std::function<Batch(size_t i)>;

  /// Sample indices of each batch of an epoch, in consumption order.
  using IndexBatches = std::vector<std::vector<int64_t>>;

  /// Generic form: `count` batches made by `make`. Starts the threads at once. Throws Error when
  /// options.threads < 1.
  BatchLoader(size_t count, MakeFn make, BatchLoaderOptions options = {});
  /// make_batch(split, batches[i], batch_options) for each i. `split` must outlive the loader.
  BatchLoader(const Split& split, IndexBatches batches, BatchOptions batch_options,
              BatchLoaderOptions options = {});
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  /// Blocks until the next batch in order is ready and returns it; std::nullopt after the last.
  /// Rethrows the exception of a batch whose preparation failed. Call from one thread.
  std::optional<Batch> next();

  /// Number of batches in the epoch.
  size_t size() const { return count_; }

 private:
  struct Slot {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };
  BatchLoader(const Split& split, std::shared_ptr<const IndexBatches> batches,
              BatchOptions batch_options, BatchLoaderOptions options);
  void work();

  const size_t count_;
  const MakeFn make_;
  const size_t max_ahead_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::optional<Slot>> slots_;  // batch i lives in slots_[i % max_ahead_]
  size_t next_claim_ = 0;                   // guarded by mu_
  size_t consumed_ = 0;                     // guarded by mu_
  bool stop_ = false;                       // guarded by mu_
  std::exception_ptr failed_;               // consumer side: the error delivered, if any
  std::vector<std::thread> threads_;
};

/// Consecutive batches of `batch` indices of `order` (the last one may be shorter); batch >= 1.
BatchLoader::IndexBatches chunk_indices(const std::vector<int64_t>& order, int64_t batch);

}  // namespace gpurun::fashion_mnist
