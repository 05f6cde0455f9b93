#include "fashion_mnist/idx.hpp"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace gpurun::fashion_mnist {
namespace detail {
namespace {

namespace fs = std::filesystem;

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// The whole decompressed content of `path`. zlib reads a file that is not gzip as it is, so
// plain IDX files need no separate path. A gzip stream that ends early or fails its CRC throws.
std::vector<uint8_t> read_all(const fs::path& path) {
  errno = 0;
  GzFile file(gzopen(path.c_str(), "rbe"));  // e: O_CLOEXEC
  if (!file) {
    throw IdxError(fmt::format("{}: cannot open: {}", path.string(),
                               errno != 0 ? std::strerror(errno) : "out of memory"));
  }
  gzbuffer(file.get(), 256 * 1024);
  constexpr size_t kChunkBytes = 1 << 20;
  std::vector<uint8_t> data;
  for (;;) {
    const size_t old_size = data.size();
    data.resize(old_size + kChunkBytes);
    const int n = gzread(file.get(), data.data() + old_size, kChunkBytes);
    data.resize(old_size + static_cast<size_t>(std::max(n, 0)));
    if (n <= 0) break;
  }
  int errnum = Z_OK;
  const char* message = gzerror(file.get(), &errnum);
  if (errnum == Z_ERRNO) {
    throw IdxError(fmt::format("{}: read failed after {} bytes: {}", path.string(), data.size(),
                               std::strerror(errno)));
  }
  if (errnum == Z_BUF_ERROR) {  // zlib's "unexpected end of file": the gzip stream stops early
    throw IdxError(fmt::format("{}: truncated gzip stream: {} after {} decompressed bytes",
                               path.string(), message, data.size()));
  }
  if (errnum != Z_OK) {
    throw IdxError(fmt::format("{}: corrupt gzip stream after {} decompressed bytes: {}",
                               path.string(), data.size(), message));
  }
  return data;
}

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string_view magic_kind(uint32_t magic) {
  switch (magic) {
    case kIdxImagesMagic:
      return "an IDX image file";
    case kIdxLabelsMagic:
      return "an IDX label file";
    default:
      return "not an IDX unsigned-byte file";
  }
}

// What one IDX read expects: magic, element noun for messages ("pixels", "labels").
struct Expect {
  uint32_t magic;
  int ndims;
  std::string_view noun;
};

// Validates the header of `data` against `expect` and returns the dimensions. Throws IdxError
// naming `path` on a short header, wrong magic, an empty image size, or a payload whose size is
// not exactly the product of the dimensions.
std::vector<int64_t> parse_header(const fs::path& path, const std::vector<uint8_t>& data,
                                  const Expect& expect) {
  const size_t header_bytes = 4 + 4 * static_cast<size_t>(expect.ndims);
  if (data.size() < 4) {
    throw IdxError(fmt::format("{}: truncated: expected a 4-byte IDX magic, got {} bytes",
                               path.string(), data.size()));
  }
  const uint32_t magic = big_endian_u32(data.data());
  if (magic != expect.magic) {
    throw IdxError(fmt::format("{}: bad magic 0x{:08x} ({}): expected 0x{:08x} ({})", path.string(),
                               magic, magic_kind(magic), expect.magic, magic_kind(expect.magic)));
  }
  if (data.size() < header_bytes) {
    throw IdxError(fmt::format("{}: truncated: expected a {}-byte IDX header, got {} bytes",
                               path.string(), header_bytes, data.size()));
  }
  std::vector<int64_t> dims;
  uint64_t elements = 1;
  for (int d = 0; d < expect.ndims; ++d) {
    const uint32_t dim = big_endian_u32(data.data() + 4 + 4 * static_cast<size_t>(d));
    if (d > 0 && dim == 0) {
      throw IdxError(fmt::format("{}: dimension {} of the header is 0: every sample is empty",
                                 path.string(), d));
    }
    if (__builtin_mul_overflow(elements, uint64_t{dim}, &elements)) {
      throw IdxError(fmt::format("{}: header dimensions overflow 64 bits: not a real IDX file",
                                 path.string()));
    }
    dims.push_back(dim);
  }
  const uint64_t got = data.size() - header_bytes;
  if (got < elements) {
    throw IdxError(fmt::format("{}: truncated: expected {} bytes of {}, got {}", path.string(),
                               elements, expect.noun, got));
  }
  if (got > elements) {
    throw IdxError(fmt::format(
        "{}: {} unexpected trailing bytes: the header announces {} bytes of {}, the file holds {}",
        path.string(), got - elements, elements, expect.noun, got));
  }
  return dims;
}

torch::Tensor to_tensor(const std::vector<uint8_t>& data, size_t offset,
                        const std::vector<int64_t>& dims) {
  auto t = torch::empty(dims, torch::kUInt8);
  std::memcpy(t.data_ptr<uint8_t>(), data.data() + offset, data.size() - offset);
  return t;
}

}  // namespace
}  // namespace detail

torch::Tensor read_idx_images(const std::filesystem::path& path) {
  const auto data = detail::read_all(path);
  const auto dims = detail::parse_header(path, data, {kIdxImagesMagic, 3, "pixels"});
  return detail::to_tensor(data, 16, dims);
}

torch::Tensor read_idx_labels(const std::filesystem::path& path) {
  const auto data = detail::read_all(path);
  const auto dims = detail::parse_header(path, data, {kIdxLabelsMagic, 1, "labels"});
  return detail::to_tensor(data, 8, dims).to(torch::kInt64);
}

IdxPair read_idx_pair(const std::filesystem::path& images_path,
                      const std::filesystem::path& labels_path) {
  IdxPair pair{read_idx_images(images_path), read_idx_labels(labels_path)};
  if (pair.images.size(0) != pair.labels.size(0)) {
    throw IdxError(fmt::format("{}: holds {} images but {} holds {} labels: not the same split",
                               images_path.string(), pair.images.size(0), labels_path.string(),
                               pair.labels.size(0)));
  }
  return pair;
}

}  // namespace gpurun::fashion_mnist
