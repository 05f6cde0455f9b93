#include "fashion_mnist/models.hpp"

#include <fmt/ranges.h>
#include <torch/version.h>

#include <cmath>
#include <string_view>

namespace gpurun::fashion_mnist {
namespace detail {
namespace {

namespace F = torch::nn::functional;

void validate(const ViTConfig& c) {
  const bool positive = c.img_size > 0 && c.patch > 0 && c.in_channels > 0 && c.embed > 0 &&
                        c.depth > 0 && c.heads > 0 && c.mlp > 0 && c.num_classes > 0;
  if (!positive || c.img_size % c.patch != 0 || c.embed % c.heads != 0) {
    throw Error(fmt::format(
        "invalid ViT config (img {}, patch {}, channels {}, embed {}, depth {}, heads {}, mlp {}, "
        "classes {}): every size must be positive, img a multiple of patch and embed a multiple "
        "of heads",
        c.img_size, c.patch, c.in_channels, c.embed, c.depth, c.heads, c.mlp, c.num_classes));
  }
}

// softmax(q k^T / sqrt(D)) v (Vaswani et al. 2017, eq. 1). q, k, v: [B, H, T, D] -> [B, H, T, D].
// The one place where the LibTorch versions differ: 2.x has a fused kernel (flash or
// memory-efficient attention on CUDA, same result up to rounding); 1.13 has not.
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v);
#else
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  return torch::softmax(torch::matmul(q * scale, k.transpose(-2, -1)), -1).matmul(v);
#endif
}

}  // namespace
}  // namespace detail

Dense::Dense(int64_t in, int64_t out, const ModelOptions& o) {
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(o.device);
  // torch::empty: no value is computed until init, or ever when the state is handed over.
  weight = register_parameter("weight", torch::empty({out, in}, opts));
  bias = register_parameter("bias", torch::empty({out}, opts));
  if (o.init) {
    torch::NoGradGuard no_grad;
    torch::nn::init::xavier_uniform_(weight);
    torch::nn::init::zeros_(bias);
  }
}

torch::Tensor Dense::forward(const torch::Tensor& x) {
  return torch::nn::functional::linear(x, weight, bias);
}

namespace detail {
namespace {

namespace F = torch::nn::functional;

// One pre-norm transformer block: x += proj(MHSA(LN1(x))); x += fc2(GELU(fc1(LN2(x)))).
class Block : public torch::nn::Module {
 public:
  Block(const ViTConfig& c, const ModelOptions& o)
      : heads_(c.heads),
        norm1_(
            register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embed})))),
        qkv_(register_module("qkv", std::make_shared<Dense>(c.embed, 3 * c.embed, o))),
        proj_(register_module("proj", std::make_shared<Dense>(c.embed, c.embed, o))),
        norm2_(
            register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embed})))),
        fc1_(register_module("fc1", std::make_shared<Dense>(c.embed, c.mlp, o))),
        fc2_(register_module("fc2", std::make_shared<Dense>(c.mlp, c.embed, o))) {}

  // x: [B, T, E] -> [B, T, E].
  torch::Tensor forward(torch::Tensor x) {
    const int64_t b = x.size(0);
    const int64_t t = x.size(1);
    const int64_t e = x.size(2);
    const auto qkv =
        qkv_->forward(norm1_(x)).reshape({b, t, 3, heads_, e / heads_}).permute({2, 0, 3, 1, 4});
    const auto heads = attention(qkv[0], qkv[1], qkv[2]);  // [B, H, T, D]
    x = x + proj_->forward(heads.transpose(1, 2).reshape({b, t, e}));
    return x + fc2_->forward(F::gelu(fc1_->forward(norm2_(x))));
  }

 private:
  int64_t heads_;
  torch::nn::LayerNorm norm1_;
  std::shared_ptr<Dense> qkv_;
  std::shared_ptr<Dense> proj_;
  torch::nn::LayerNorm norm2_;
  std::shared_ptr<Dense> fc1_;
  std::shared_ptr<Dense> fc2_;
};

}  // namespace
}  // namespace detail

int64_t vit_param_count(const ViTConfig& c) {
  detail::validate(c);
  const int64_t e = c.embed;
  const int64_t m = c.mlp;
  const int64_t tokens = (c.img_size / c.patch) * (c.img_size / c.patch) + 1;
  const int64_t patch_embed = e * c.in_channels * c.patch * c.patch + e;
  const int64_t cls_and_pos = e + tokens * e;
  const int64_t block = (4 * e * e + 4 * e) + (2 * e * m + m + e) + 4 * e;
  const int64_t norm_and_head = 2 * e + e * c.num_classes + c.num_classes;
  return patch_embed + cls_and_pos + c.depth * block + norm_and_head;
}

ViT::ViT(const ViTConfig& config, const ModelOptions& options) : config_(config) {
  detail::validate(config_);
  const int64_t e = config_.embed;
  const int64_t grid = config_.img_size / config_.patch;
  patch_embed_ = register_module(
      "patch_embed",
      torch::nn::Conv2d(
          torch::nn::Conv2dOptions(config_.in_channels, e, config_.patch).stride(config_.patch)));
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(options.device);
  cls_token_ = register_parameter("cls_token", torch::zeros({1, 1, e}, opts));
  pos_embed_ = register_parameter("pos_embed", torch::zeros({1, grid * grid + 1, e}, opts));
  if (options.init) {
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(cls_token_, 0.0, 0.02);
    torch::nn::init::normal_(pos_embed_, 0.0, 0.02);
  }
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.depth; ++i) {
    blocks_->push_back(std::make_shared<detail::Block>(config_, options));
  }
  norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({e})));
  head_ = register_module("head", std::make_shared<Dense>(e, config_.num_classes, options));
  // The small rest (patch embedding, LayerNorms): built by LibTorch on the CPU, moved here.
  to(options.device);
}

torch::Tensor ViT::forward(const torch::Tensor& images) {
  const auto& c = config_;
  if (images.dim() != 4 || images.size(1) != c.in_channels || images.size(2) != c.img_size ||
      images.size(3) != c.img_size) {
    throw Error(fmt::format("ViT: input of shape {} does not match [B, {}, {}, {}]",
                            fmt::join(images.sizes(), "x"), c.in_channels, c.img_size, c.img_size));
  }
  const int64_t b = images.size(0);
  auto x = patch_embed_(images).flatten(2).transpose(1, 2);             // [B, N, E]
  x = torch::cat({cls_token_.expand({b, -1, -1}), x}, 1) + pos_embed_;  // [B, N + 1, E]
  for (const auto& block : *blocks_) x = block->as<detail::Block>()->forward(x);
  return head_->forward(norm_(x).select(1, 0));  // [B, classes]
}

SmallCnn::SmallCnn(int64_t num_classes) {
  using torch::nn::Conv2dOptions;
  conv1_ = register_module("conv1", torch::nn::Conv2d(Conv2dOptions(1, 32, 3).padding(1)));
  conv2_ = register_module("conv2", torch::nn::Conv2d(Conv2dOptions(32, 64, 3).padding(1)));
  fc1_ = register_module("fc1", torch::nn::Linear(64 * 7 * 7, 128));
  fc2_ = register_module("fc2", torch::nn::Linear(128, num_classes));
}

torch::Tensor SmallCnn::forward(const torch::Tensor& images) {
  auto x = torch::max_pool2d(torch::relu(conv1_(images)), 2);  // [B, 32, 14, 14]
  x = torch::max_pool2d(torch::relu(conv2_(x)), 2);            // [B, 64, 7, 7]
  return fc2_(torch::relu(fc1_(x.flatten(1))));
}

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names{"cnn", "tiny", "small", "b", "h"};
  return names;
}

namespace detail {
namespace {

struct VitPreset {
  const char* name;
  int64_t img_size, patch, embed, depth, heads, mlp;
};

// The ViT presets (documented at vit_preset() in models.hpp).
constexpr VitPreset kVitPresets[] = {
    // {name, img_size, patch, embed, depth, heads, mlp}
    {"tiny", 28, 7, 64, 4, 4, 128},
    {"small", 28, 4, 192, 6, 3, 768},
    {"b", 224, 16, 768, 12, 12, 3072},
    {"h", 224, 16, 1280, 32, 16, 5120},
};

}  // namespace
}  // namespace detail

ViTConfig vit_preset(const std::string& name, int64_t num_classes) {
  for (const auto& p : detail::kVitPresets) {
    if (name == p.name) {
      return {.img_size = p.img_size,
              .patch = p.patch,
              .embed = p.embed,
              .depth = p.depth,
              .heads = p.heads,
              .mlp = p.mlp,
              .num_classes = num_classes};
    }
  }
  std::vector<std::string_view> names;
  for (const auto& p : detail::kVitPresets) names.emplace_back(p.name);
  throw Error(
      fmt::format("unknown ViT preset \"{}\": expected one of {}", name, fmt::join(names, ", ")));
}

std::shared_ptr<Classifier> make_model(const std::string& name, int64_t num_classes,
                                       const ModelOptions& options) {
  if (name == "cnn") {
    auto cnn = std::make_shared<SmallCnn>(num_classes);
    cnn->to(options.device);
    return cnn;
  }
  for (const auto& known : model_names()) {
    if (name == known) return std::make_shared<ViT>(vit_preset(name, num_classes), options);
  }
  throw Error(fmt::format("unknown model preset \"{}\": expected one of {}", name,
                          fmt::join(model_names(), ", ")));
}

int64_t count_parameters(const torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

torch::Tensor model_input(const Batch& batch, const torch::Device& device, int64_t size) {
  torch::Tensor x = batch.images.to(device, /*non_blocking=*/true);
  if (x.size(-1) == size) return x;
  namespace F = torch::nn::functional;
  return F::interpolate(x, F::InterpolateFuncOptions()
                               .size(std::vector<int64_t>{size, size})
                               .mode(torch::kBicubic)
                               .align_corners(false));
}

EvalSums evaluate(Classifier& model, const Split& split, const std::vector<int64_t>& indices,
                  const BatchOptions& options, int threads, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  model.eval();
  EvalSums sums;
  BatchLoader loader(split, chunk_indices(indices, 500), options, {.threads = threads});
  while (auto b = loader.next()) {
    const torch::Tensor labels = b->labels.to(device, /*non_blocking=*/true);
    const torch::Tensor logits = model.forward(model_input(*b, device, model.input_size()));
    sums.loss +=
        torch::nn::functional::cross_entropy(
            logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
            .item<double>();
    sums.correct += logits.argmax(1).eq(labels).sum().item<double>();
    sums.count += static_cast<double>(labels.size(0));
  }
  return sums;
}

}  // namespace gpurun::fashion_mnist
