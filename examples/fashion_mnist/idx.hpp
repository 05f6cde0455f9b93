// Reader of the IDX files Fashion-MNIST ships in (gzip-compressed or plain).
// Format: http://yann.lecun.com/exdb/mnist/ ("FILE FORMATS FOR THE MNIST DATABASE"): a
// big-endian 32-bit magic 0x000008DD (0x08 = unsigned byte, DD = number of dimensions), one
// big-endian uint32 per dimension, then the elements in row-major order.
#pragma once

#include <torch/torch.h>

#include <filesystem>

#include "gpurun/error.hpp"

namespace gpurun::fashion_mnist {

/// An IDX file is missing, unreadable, not gzip/IDX, truncated or inconsistent. what() names the
/// file and the defect, e.g. "/data/train-images-idx3-ubyte.gz: truncated: expected 47040000
/// bytes of pixels, got 1234".
class IdxError : public Error {
 public:
  using Error::Error;
};

/// Magic of an IDX image file: unsigned bytes, 3 dimensions [N, rows, cols].
inline constexpr uint32_t kIdxImagesMagic = 0x00000803;
/// Magic of an IDX label file: unsigned bytes, 1 dimension [N].
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;

/// Reads an IDX image file. `path` may be gzip-compressed (read through zlib, no temporary
/// file) or plain; the content decides, not the name. Blocks on file I/O (~0.3 s for the
/// 26 MB Fashion-MNIST training images on one core).
/// Returns: uint8 [N, rows, cols], contiguous, CPU; N may be 0, rows and cols are >= 1.
/// Throws IdxError naming `path` when the file cannot be opened, the gzip stream is corrupt,
/// the magic is not 0x00000803, a dimension is 0, or the file holds fewer or more than
/// 16 + N*rows*cols bytes.
torch::Tensor read_idx_images(const std::filesystem::path& path);

/// Reads an IDX label file (magic 0x00000801), compressed or plain as read_idx_images.
/// Returns: int64 [N], CPU, the stored byte values 0..255 (not range-checked here).
/// Throws IdxError naming `path` as read_idx_images does.
torch::Tensor read_idx_labels(const std::filesystem::path& path);

/// Images and labels of one split.
struct IdxPair {
  torch::Tensor images;  ///< uint8 [N, rows, cols]
  torch::Tensor labels;  ///< int64 [N]
};

/// Reads an image file and its label file and checks that they hold the same number of
/// samples. Throws IdxError (naming both files and both counts on a count mismatch).
IdxPair read_idx_pair(const std::filesystem::path& images_path,
                      const std::filesystem::path& labels_path);

}  // namespace gpurun::fashion_mnist
