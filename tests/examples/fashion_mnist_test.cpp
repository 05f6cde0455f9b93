#include "fashion_mnist/dataset.hpp"
#include "fashion_mnist/idx.hpp"
#include "fashion_mnist/models.hpp"
#include "fashion_mnist/progress.hpp"

#include <dirent.h>
#include <doctest/doctest.h>

#include <fmt/ranges.h>
#include <unistd.h>
#include <zlib.h>
#include "gpurun_process.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fm = gpurun::fashion_mnist;
namespace fs = std::filesystem;

namespace {

// The real dataset: Debian's dataset-fashion-mnist, or GPURUN_FMNIST_DIR (machines without the
// package, e.g. the GPU machine, carry a copy).
const fs::path kDataDir = std::getenv("GPURUN_FMNIST_DIR") != nullptr
                              ? fs::path(std::getenv("GPURUN_FMNIST_DIR"))
                              : fs::path(fm::kDefaultDataDir);

// Loaded once for the whole executable (~0.5 s).
const fm::FashionMnist& dataset() {
  static const fm::FashionMnist data = fm::FashionMnist::load(kDataDir);
  return data;
}

// A scratch directory (tests/common's TempDir; it avoids std::filesystem::remove_all, which
// crashes when called through the LibTorch 2.11 wheel's copy).
struct ScratchDir : gpurun::testing::TempDir {
  ScratchDir() : gpurun::testing::TempDir("fmnist-test") {}
};

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

void write_gzip(const fs::path& p, const std::string& bytes) {
  gzFile f = gzopen(p.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

// The whole decompressed content of a .gz file.
std::string gunzip(const fs::path& p) {
  gzFile f = gzopen(p.c_str(), "rb");
  REQUIRE(f != nullptr);
  std::string out;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  gzclose(f);
  return out;
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

// An IDX image file of n images of rows x cols; pixel k holds k % 251.
std::string idx_images(uint32_t n, uint32_t rows, uint32_t cols) {
  std::string s = be32(fm::kIdxImagesMagic) + be32(n) + be32(rows) + be32(cols);
  for (size_t k = 0; k < size_t{n} * rows * cols; ++k) s.push_back(static_cast<char>(k % 251));
  return s;
}

std::string idx_labels(const std::vector<uint8_t>& labels) {
  std::string s = be32(fm::kIdxLabelsMagic) + be32(static_cast<uint32_t>(labels.size()));
  for (auto l : labels) s.push_back(static_cast<char>(l));
  return s;
}

// "5x1x28x28": a shape doctest can print.
std::string shape(const torch::Tensor& t) {
  return fmt::format("{}", fmt::join(t.sizes(), "x"));
}

// "Float", "Long", "Byte": a dtype doctest can print.
std::string dtype(const torch::Tensor& t) {
  return c10::toString(t.scalar_type());
}

// Runs `f`, which must throw gpurun::Error, and returns its message.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const gpurun::Error& e) {
    return e.what();
  }
  FAIL("no gpurun::Error thrown");
  return {};
}

// The expected normalised float32 image [1, 28, 28] of split sample i.
torch::Tensor normalised(const fm::Split& split, int64_t i, const fm::NormStats& s) {
  return (split.images[i].to(torch::kFloat32).unsqueeze(0) / 255.0 - s.mean) / s.std;
}

}  // namespace

// ---- IDX reader --------------------------------------------------------------------------------

TEST_CASE("idx: the real Fashion-MNIST files load with the published sizes and labels") {
  const auto& d = dataset();
  CHECK(shape(d.train.images) == "60000x28x28");
  CHECK(shape(d.test.images) == "10000x28x28");
  CHECK(dtype(d.train.images) == "Byte");
  CHECK(dtype(d.train.labels) == "Long");
  CHECK(shape(d.train.labels) == "60000");
  CHECK(shape(d.test.labels) == "10000");
  CHECK(d.train.labels.min().item<int64_t>() == 0);
  CHECK(d.train.labels.max().item<int64_t>() == 9);
  // Read from the files (Python gzip): train labels start 9 0 0 3 0 2, test labels 9 2 1 1 6.
  CHECK(d.train.labels[0].item<int64_t>() == 9);  // ankle boot
  CHECK(d.train.labels[3].item<int64_t>() == 3);
  CHECK(d.train.labels[5].item<int64_t>() == 2);
  CHECK(d.test.labels[0].item<int64_t>() == 9);
  CHECK(d.test.labels[1].item<int64_t>() == 2);
  // The training set is balanced: 6000 of each class.
  const auto counts = torch::bincount(d.train.labels);
  CHECK(torch::all(counts == 6000).item<bool>());
}

TEST_CASE("idx: a gzip file and its uncompressed copy give identical tensors") {
  ScratchDir tmp;
  const auto gz_images = kDataDir / "t10k-images-idx3-ubyte.gz";
  const auto gz_labels = kDataDir / "t10k-labels-idx1-ubyte.gz";
  write_bytes(tmp.path / "images", gunzip(gz_images));
  write_bytes(tmp.path / "labels", gunzip(gz_labels));
  const auto gz = fm::read_idx_pair(gz_images, gz_labels);
  const auto raw = fm::read_idx_pair(tmp.path / "images", tmp.path / "labels");
  CHECK(torch::equal(gz.images, raw.images));
  CHECK(torch::equal(gz.labels, raw.labels));
  CHECK(torch::equal(gz.images, dataset().test.images));

  // And a small synthetic file, byte for byte.
  const std::string bytes = idx_images(3, 4, 5);
  write_bytes(tmp.path / "small", bytes);
  write_gzip(tmp.path / "small.gz", bytes);
  const auto a = fm::read_idx_images(tmp.path / "small");
  const auto b = fm::read_idx_images(tmp.path / "small.gz");
  CHECK(shape(a) == "3x4x5");
  CHECK(torch::equal(a, b));
  CHECK(a[2][3][4].item<int>() == 59);  // element 59 of the row-major order
}

TEST_CASE("idx: every defect is a gpurun::Error naming the file and the problem") {
  ScratchDir tmp;
  const auto path = [&](const char* name) { return tmp.path / name; };

  SUBCASE("missing file") {
    const auto msg = error_of([&] { fm::read_idx_images(path("nope.gz")); });
    CHECK(msg.find(path("nope.gz").string()) != std::string::npos);
    CHECK(msg.find("No such file") != std::string::npos);
  }
  SUBCASE("truncated pixels, plain and gzip") {
    const std::string bytes = idx_images(3, 4, 4).substr(0, 16 + 20);
    write_bytes(path("short"), bytes);
    write_gzip(path("short.gz"), bytes);
    for (const char* name : {"short", "short.gz"}) {
      const auto msg = error_of([&] { fm::read_idx_images(path(name)); });
      CHECK(msg == path(name).string() + ": truncated: expected 48 bytes of pixels, got 20");
    }
  }
  SUBCASE("truncated header") {
    write_bytes(path("hdr"), be32(fm::kIdxImagesMagic) + be32(1));
    const auto msg = error_of([&] { fm::read_idx_images(path("hdr")); });
    CHECK(msg == path("hdr").string() + ": truncated: expected a 16-byte IDX header, got 8 bytes");
  }
  SUBCASE("trailing bytes") {
    write_bytes(path("long"), idx_labels({1, 2, 3}) + "xy");
    const auto msg = error_of([&] { fm::read_idx_labels(path("long")); });
    CHECK(msg.find(path("long").string() + ": 2 unexpected trailing bytes") == 0);
  }
  SUBCASE("bad magic: a label file read as images, and junk") {
    write_bytes(path("labels"), idx_labels({1, 2, 3}));
    auto msg = error_of([&] { fm::read_idx_images(path("labels")); });
    CHECK(msg == path("labels").string() +
                     ": bad magic 0x00000801 (an IDX label file): expected 0x00000803 (an IDX "
                     "image file)");
    write_bytes(path("junk"), "hello, world");
    msg = error_of([&] { fm::read_idx_labels(path("junk")); });
    CHECK(msg.find(path("junk").string() + ": bad magic 0x68656c6c") == 0);
  }
  SUBCASE("zero-sized images") {
    write_bytes(path("empty"), be32(fm::kIdxImagesMagic) + be32(2) + be32(0) + be32(28));
    const auto msg = error_of([&] { fm::read_idx_images(path("empty")); });
    CHECK(msg.find(path("empty").string()) == 0);
    CHECK(msg.find("dimension 1 of the header is 0") != std::string::npos);
  }
  SUBCASE("a gzip stream cut in half") {
    const std::string gz = read_bytes(kDataDir / "t10k-labels-idx1-ubyte.gz");
    write_bytes(path("cut.gz"), gz.substr(0, gz.size() / 2));
    const auto msg = error_of([&] { fm::read_idx_labels(path("cut.gz")); });
    CHECK(msg.find(path("cut.gz").string() + ": truncated gzip stream") == 0);
  }
  SUBCASE("a corrupt gzip stream") {
    std::string gz = read_bytes(kDataDir / "t10k-labels-idx1-ubyte.gz");
    for (size_t i = 100; i < 200; ++i) gz[i] = static_cast<char>(gz[i] ^ 0x5a);
    write_bytes(path("bad.gz"), gz);
    const auto msg = error_of([&] { fm::read_idx_labels(path("bad.gz")); });
    CHECK(msg.find(path("bad.gz").string() + ": corrupt gzip stream") == 0);
  }
  SUBCASE("image and label counts differ") {
    write_bytes(path("img"), idx_images(3, 2, 2));
    write_bytes(path("lab"), idx_labels({0, 1, 2, 3}));
    const auto msg = error_of([&] { fm::read_idx_pair(path("img"), path("lab")); });
    CHECK(msg == path("img").string() + ": holds 3 images but " + path("lab").string() +
                     " holds 4 labels: not the same split");
  }
}

TEST_CASE("dataset: a directory with a bad file fails naming that file") {
  ScratchDir tmp;
  const auto file = [&](const char* name) { return tmp.path / name; };
  write_gzip(file("train-images-idx3-ubyte.gz"), idx_images(3, 28, 28));
  write_gzip(file("train-labels-idx1-ubyte.gz"), idx_labels({1, 2, 3}));
  write_gzip(file("t10k-images-idx3-ubyte.gz"), idx_images(2, 28, 28));
  write_gzip(file("t10k-labels-idx1-ubyte.gz"), idx_labels({1, 2}));
  const auto small = fm::FashionMnist::load(tmp.path);  // a valid (tiny) dataset
  CHECK(small.train.size() == 3);
  CHECK(small.test.size() == 2);

  SUBCASE("counts differ") {
    write_gzip(file("t10k-labels-idx1-ubyte.gz"), idx_labels({1, 2, 3}));
    CHECK(error_of([&] { fm::FashionMnist::load(tmp.path); }) ==
          file("t10k-images-idx3-ubyte.gz").string() + ": holds 2 images but " +
              file("t10k-labels-idx1-ubyte.gz").string() + " holds 3 labels: not the same split");
  }
  SUBCASE("a label outside 0..9") {
    write_gzip(file("train-labels-idx1-ubyte.gz"), idx_labels({1, 10, 3}));
    CHECK(error_of([&] { fm::FashionMnist::load(tmp.path); }) ==
          file("train-labels-idx1-ubyte.gz").string() + ": label 10 is outside 0..9");
  }
  SUBCASE("images that are not 28x28") {
    write_gzip(file("train-images-idx3-ubyte.gz"), idx_images(3, 27, 28));
    CHECK(error_of([&] { fm::FashionMnist::load(tmp.path); }) ==
          file("train-images-idx3-ubyte.gz").string() +
              ": images are 27x28, Fashion-MNIST's are 28x28");
  }
  SUBCASE("a missing file") {
    REQUIRE(::unlink(file("t10k-images-idx3-ubyte.gz").c_str()) == 0);
    const auto msg = error_of([&] { fm::FashionMnist::load(tmp.path); });
    CHECK(msg.find(file("t10k-images-idx3-ubyte.gz").string() + ": cannot open") == 0);
  }
}

// ---- normalisation and batches ----------------------------------------------------------------

TEST_CASE("dataset: normalisation statistics of the training set") {
  const auto& d = dataset();
  CHECK(d.stats.mean == doctest::Approx(0.2860405969887955).epsilon(1e-12));
  CHECK(d.stats.std == doctest::Approx(0.3530242445149226).epsilon(1e-12));
  CHECK(d.stats.mean == doctest::Approx(fm::kTrainStats.mean).epsilon(1e-12));
  CHECK(d.stats.std == doctest::Approx(fm::kTrainStats.std).epsilon(1e-12));
  // Normalised training pixels have mean 0 and std 1.
  const auto all = fm::make_batch(d.train, [] {
    std::vector<int64_t> v(5000);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i) * 12;
    return v;
  }());
  CHECK(all.images.mean().item<double>() == doctest::Approx(0.0).epsilon(0.02));
  CHECK(all.images.std().item<double>() == doctest::Approx(1.0).epsilon(0.02));
  CHECK_THROWS_AS(fm::compute_norm_stats(torch::zeros({3}, torch::kFloat32)), gpurun::Error);
}

TEST_CASE("dataset: make_batch shapes, dtypes, values and index order") {
  const auto& d = dataset();
  const std::vector<int64_t> idx{5, 0, 59999, 3, 5};
  const auto b = fm::make_batch(d.train, idx, {.stats = d.stats});
  CHECK(shape(b.images) == "5x1x28x28");
  CHECK(dtype(b.images) == "Float");
  CHECK(shape(b.labels) == "5");
  CHECK(dtype(b.labels) == "Long");
  for (size_t k = 0; k < idx.size(); ++k) {
    CHECK(b.labels[static_cast<int64_t>(k)].item<int64_t>() ==
          d.train.labels[idx[k]].item<int64_t>());
    CHECK(torch::allclose(b.images[static_cast<int64_t>(k)], normalised(d.train, idx[k], d.stats),
                          1e-5, 1e-5));
  }
  CHECK(b.labels[0].item<int64_t>() == 2);  // sample 5
  CHECK(b.labels[1].item<int64_t>() == 9);  // sample 0
  CHECK_FALSE(b.images.is_pinned());        // CPU build: pin_memory is not requested

  SUBCASE("resize to 56 and 224 keeps the mean and the order") {
    for (auto mode : {fm::ResizeMode::kBilinear, fm::ResizeMode::kBicubic}) {
      const auto big =
          fm::make_batch(d.train, idx, {.stats = d.stats, .img_size = 56, .resize = mode});
      CHECK(shape(big.images) == "5x1x56x56");
      CHECK(torch::equal(big.labels, b.labels));
      CHECK(torch::allclose(big.images.mean({2, 3}), b.images.mean({2, 3}), 0.0, 0.05));
    }
    const auto vit = fm::make_batch(d.train, {0, 1}, {.img_size = 224});
    CHECK(shape(vit.images) == "2x1x224x224");
  }
  SUBCASE("pin_memory is ignored without CUDA") {
    const auto pinned = fm::make_batch(d.train, idx, {.pin_memory = true});
    CHECK(pinned.images.is_pinned() == at::hasCUDA());
  }
  SUBCASE("bad indices") {
    CHECK(error_of([&] {
            fm::make_batch(d.test, {0, 10000});
          }) == "make_batch: index 10000 (position 1 of 2) is outside a split of 10000 samples");
    CHECK_THROWS_AS(fm::make_batch(d.test, {-1}), gpurun::Error);
    CHECK_THROWS_AS(fm::make_batch(d.test, {}), gpurun::Error);
  }
}

// ---- loader -----------------------------------------------------------------------------------

TEST_CASE("loader: loader_threads is half the cores divided among the local workers") {
  CHECK(fm::loader_threads(1, 16) == 8);
  CHECK(fm::loader_threads(2, 16) == 4);
  CHECK(fm::loader_threads(3, 16) == 2);
  CHECK(fm::loader_threads(16, 16) == 1);
  CHECK(fm::loader_threads(1, 2) == 1);
  CHECK(fm::loader_threads(1, 1) == 1);
  CHECK(fm::loader_threads(1, 0) == 1);
  CHECK(fm::loader_threads(0, 16) == 8);
  CHECK(fm::loader_threads(8, 128) == 8);
}

TEST_CASE("loader: batches arrive in order however long each takes, never too far ahead") {
  constexpr size_t kCount = 60;
  constexpr size_t kAhead = 5;
  std::atomic<size_t> started{0};
  std::atomic<size_t> consumed{0};
  std::atomic<size_t> max_lead{0};
  auto make = [&](size_t i) {
    const size_t lead = ++started - consumed.load();  // batches claimed but not yet handed out
    size_t seen = max_lead.load();
    while (lead > seen && !max_lead.compare_exchange_weak(seen, lead)) {
    }
    std::mt19937 rng(static_cast<unsigned>(i));
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    return fm::Batch{torch::full({1}, static_cast<int64_t>(i)), torch::empty({0})};
  };
  fm::BatchLoader loader(kCount, make, {.threads = 4, .max_ahead = kAhead});
  CHECK(loader.size() == kCount);
  for (size_t i = 0; i < kCount; ++i) {
    ++consumed;  // counted when next() begins: batch i + kAhead may be claimed once it returns
    auto b = loader.next();
    REQUIRE(b.has_value());
    CHECK(b->images.item<int64_t>() == static_cast<int64_t>(i));
  }
  CHECK_FALSE(loader.next().has_value());
  CHECK_FALSE(loader.next().has_value());
  CHECK(max_lead.load() <= kAhead);
}

TEST_CASE("loader: real batches in order from a split") {
  const auto& d = dataset();
  fm::BatchLoader::IndexBatches batches{{3, 1}, {4, 1, 5}, {9}, {2, 6}};
  fm::BatchLoader loader(d.test, batches, {.stats = d.stats}, {.threads = 3});
  for (const auto& want : batches) {
    const auto b = loader.next();
    REQUIRE(b.has_value());
    CHECK(torch::equal(b->labels, d.test.labels.index_select(0, torch::tensor(want))));
  }
  CHECK_FALSE(loader.next().has_value());
}

TEST_CASE("loader: an exception in a loader thread reaches the consumer in order") {
  SUBCASE("from a make function") {
    auto make = [](size_t i) {
      if (i == 7) throw gpurun::Error("batch 7 is cursed");
      return fm::Batch{torch::full({1}, static_cast<int64_t>(i)), torch::empty({0})};
    };
    fm::BatchLoader loader(40, make, {.threads = 3});
    for (int64_t i = 0; i < 7; ++i) CHECK(loader.next()->images.item<int64_t>() == i);
    CHECK_THROWS_WITH_AS(loader.next(), "batch 7 is cursed", gpurun::Error);
    CHECK_THROWS_WITH_AS(loader.next(), "batch 7 is cursed", gpurun::Error);
  }  // the destructor joins the threads still waiting for room
  SUBCASE("from make_batch on a bad index") {
    fm::BatchLoader loader(dataset().test, {{0, 1}, {2, 12345}, {4}}, {}, {.threads = 2});
    CHECK(loader.next().has_value());
    CHECK_THROWS_WITH_AS(
        loader.next(),
        "make_batch: index 12345 (position 1 of 2) is outside a split of 10000 samples",
        gpurun::Error);
  }
  SUBCASE("a loader dropped early does not hang") {
    fm::BatchLoader loader(1000, [](size_t) { return fm::Batch{}; }, {.threads = 4});
    CHECK(loader.next().has_value());
  }
  CHECK_THROWS_AS(fm::BatchLoader(1, [](size_t) { return fm::Batch{}; }, {.threads = 0}),
                  gpurun::Error);
}

// ---- models -----------------------------------------------------------------------------------

TEST_CASE("models: output shapes of the cnn and the tiny and small ViTs") {
  torch::NoGradGuard no_grad;
  for (const char* name : {"cnn", "tiny", "small"}) {
    INFO(name);
    auto model = fm::make_model(name);
    CHECK(model->input_size() == 28);
    const auto logits = model->forward(torch::randn({3, 1, 28, 28}));
    CHECK(shape(logits) == "3x10");
    CHECK(dtype(logits) == "Float");
    CHECK(torch::isfinite(logits).all().item<bool>());
  }
  CHECK(fm::count_parameters(*fm::make_model("cnn")) == 421642);
  CHECK(fm::make_model("tiny", 7)->forward(torch::randn({2, 1, 28, 28})).size(1) == 7);
  const auto msg = error_of([] { fm::make_model("tiny")->forward(torch::randn({2, 1, 32, 32})); });
  CHECK(msg == "ViT: input of shape 2x1x32x32 does not match [B, 1, 28, 28]");
}

TEST_CASE("models: a training step changes every ViT parameter (gradients reach them all)") {
  auto model = fm::make_model("tiny");
  std::vector<torch::Tensor> before;
  for (const auto& p : model->parameters()) before.push_back(p.detach().clone());
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  const auto loss = torch::nn::functional::cross_entropy(
      model->forward(torch::randn({4, 1, 28, 28})), torch::tensor({0, 1, 2, 3}));
  loss.backward();
  opt.step();
  size_t i = 0;
  for (const auto& p : model->parameters()) CHECK_FALSE(torch::equal(p, before[i++]));
}

TEST_CASE(
    "models: a joiner's uninitialised ViT (ModelOptions.init = false) has the same state layout; "
    "a seeded init is reproducible") {
  torch::manual_seed(3);
  const auto a = fm::make_model("tiny");
  torch::manual_seed(3);
  const auto b = fm::make_model("tiny", 10, {.device = torch::kCPU, .init = true});
  const auto joiner = fm::make_model("tiny", 10, {.device = torch::kCPU, .init = false});
  const auto pa = a->named_parameters(), pb = b->named_parameters(),
             pj = joiner->named_parameters();
  REQUIRE(pa.size() == pj.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    CAPTURE(pa[i].key());
    CHECK(pa[i].key() == pj[i].key());  // the names a handoff, snapshot or checkpoint matches on
    CHECK(shape(pa[i].value()) == shape(pj[i].value()));
    CHECK(torch::equal(pa[i].value(), pb[i].value()));
  }
  // Linear layers keep torch::nn::Linear's names; Xavier-uniform weights, zero biases.
  const torch::Tensor qkv = pa["blocks.0.qkv.weight"];
  CHECK(shape(qkv) == "192x64");
  const double bound = std::sqrt(6.0 / (64 + 192));
  CHECK(qkv.abs().max().item<double>() <= bound);
  CHECK(qkv.abs().max().item<double>() > 0.9 * bound);
  CHECK(pa["blocks.0.qkv.bias"].abs().max().item<double>() == 0);
}

TEST_CASE("models: unknown preset names list the allowed ones") {
  CHECK(error_of([] { fm::make_model("vit-l"); }) ==
        "unknown model preset \"vit-l\": expected one of cnn, tiny, small, b, h");
  CHECK(error_of([] { fm::vit_preset("cnn"); }) ==
        "unknown ViT preset \"cnn\": expected one of tiny, small, b, h");
  CHECK_THROWS_AS(fm::ViT(fm::ViTConfig{.img_size = 30, .patch = 7}), gpurun::Error);
  CHECK_THROWS_AS(fm::ViT(fm::ViTConfig{.embed = 30, .heads = 4}), gpurun::Error);
}

TEST_CASE("models: the analytic ViT parameter count") {
  // Equal to the constructed model's count for small configs.
  for (const auto& c : {fm::vit_preset("tiny"), fm::vit_preset("small"),
                        fm::ViTConfig{.img_size = 8,
                        .patch = 4,
                        .in_channels = 3,
                        .embed = 12,
                        .depth = 2,
                        .heads = 3,
                        .mlp = 20,
                        .num_classes = 5}}) {
    CHECK(fm::vit_param_count(c) == fm::count_parameters(fm::ViT(c)));
  }
  CHECK(fm::vit_param_count(fm::vit_preset("tiny")) == 139018);
  CHECK(fm::vit_param_count(fm::vit_preset("small")) == 2684554);
  // ViT-B/16 as published (RGB, ImageNet-1k head): 86,567,656 parameters, the paper's "86M".
  auto b = fm::vit_preset("b", 1000);
  b.in_channels = 3;
  CHECK(fm::vit_param_count(b) == 86567656);
  // ViT-H/14 as published (RGB, 1000 classes): 632,045,800, the paper's "632M".
  auto h14 = fm::vit_preset("h", 1000);
  h14.in_channels = 3;
  h14.patch = 14;
  CHECK(fm::vit_param_count(h14) == 632045800);
  // The presets here: grayscale input, 10 classes.
  CHECK(fm::vit_param_count(fm::vit_preset("b")) == 85413130);   // ~85.4M
  CHECK(fm::vit_param_count(fm::vit_preset("h")) == 630275850);  // ~630.3M
}

// ---- progress line ----------------------------------------------------------------------------

namespace {

struct FakeClock {
  std::chrono::steady_clock::time_point t{};
  void advance(double seconds) {
    t += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(seconds));
  }
  std::function<std::chrono::steady_clock::time_point()> source() {
    return [this] { return t; };
  }
};

}  // namespace

TEST_CASE("progress: durations and devices") {
  using std::chrono::duration;
  CHECK(fm::format_duration(duration<double>(0)) == "00:00");
  CHECK(fm::format_duration(duration<double>(59.9)) == "00:59");
  CHECK(fm::format_duration(duration<double>(754)) == "12:34");
  CHECK(fm::format_duration(duration<double>(3661)) == "1:01:01");
  CHECK(fm::format_duration(duration<double>(-5)) == "00:00");
  CHECK(fm::format_devices({}) == "cpu");
  CHECK(fm::format_devices({0, 1, 3}) == "gpus[0,1,3]");
}

TEST_CASE("progress: a terminal gets one line redrawn in place, then the summary") {
  FakeClock clock;
  std::ostringstream out;
  fm::ProgressLine p(out, {.tty = true, .now = clock.source(), .bar_width = 10});
  p.begin_epoch(2, 5, 20, {0, 1});
  CHECK(out.str() ==
        "\repoch 2/5 gpus[0,1]   0%|          | 0/20 [00:00<?, ? it/s] loss 0.0000 "
        "acc 0.00%");
  out.str("");
  clock.advance(10);
  p.update(10, {0.5, 0.8});
  CHECK(out.str() ==
        "\repoch 2/5 gpus[0,1]  50%|#####     | 10/20 [00:10<00:10, 1.00 it/s] "
        "loss 0.5000 acc 80.00%");
  out.str("");
  clock.advance(0.05);  // within min_redraw: no redraw
  p.update(11, {0.5, 0.8});
  CHECK(out.str().empty());
  clock.advance(0.2);
  p.set_gpus({0, 1, 2});  // an elastic resize: shown from the next redraw on
  p.update(12, {0.5, 0.8});
  CHECK(out.str().find("\repoch 2/5 gpus[0,1,2]  60%|######    | 12/20") == 0);
  out.str("");
  clock.advance(9.75);
  p.update(20, {0.25, 0.9});
  p.end_epoch(fm::EpochStats{0.4, 0.85});
  const std::string summary =
      "epoch 2/5 gpus[0,1,2] 20/20 in 00:20 (1.00 it/s) train loss 0.2500 acc 90.00% | val loss "
      "0.4000 acc 85.00%";
  CHECK(p.summary_text(fm::EpochStats{0.4, 0.85}) == summary);
  const std::string text = out.str();
  // The final bar, then the summary over it (padded to the bar's width) and a newline.
  CHECK(text.find("\repoch 2/5 gpus[0,1,2] 100%|##########| 20/20 [00:20<00:00, 1.00 it/s]") == 0);
  const auto last = text.rfind('\r');
  CHECK(text.substr(last + 1, summary.size()) == summary);
  CHECK(text.back() == '\n');
  CHECK(text.find_first_not_of(' ', last + 1 + summary.size()) == text.size() - 1);
}

TEST_CASE("progress: a pipe gets exactly one plain line per epoch, without carriage returns") {
  FakeClock clock;
  std::ostringstream out;
  fm::ProgressLine p(out, {.tty = false, .now = clock.source()});
  for (int epoch = 1; epoch <= 3; ++epoch) {
    const size_t printed = out.str().size();
    p.begin_epoch(epoch, 3, 100, {});
    for (int step = 1; step <= 100; ++step) {
      clock.advance(0.5);
      p.update(step, {1.0 / step, 0.5});
    }
    CHECK(out.str().size() == printed);  // nothing during the epoch
    clock.advance(30);                   // validation: not part of the epoch's time
    p.end_epoch(epoch == 3 ? std::nullopt : std::optional(fm::EpochStats{0.3, 0.875}));
  }
  const std::string text = out.str();
  CHECK(text.find('\r') == std::string::npos);
  CHECK(text ==
        "epoch 1/3 cpu 100/100 in 00:50 (2.00 it/s) train loss 0.0100 acc 50.00% | val loss "
        "0.3000 acc 87.50%\n"
        "epoch 2/3 cpu 100/100 in 00:50 (2.00 it/s) train loss 0.0100 acc 50.00% | val loss "
        "0.3000 acc 87.50%\n"
        "epoch 3/3 cpu 100/100 in 00:50 (2.00 it/s) train loss 0.0100 acc 50.00%\n");
}
