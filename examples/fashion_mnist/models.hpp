// Classifiers for Fashion-MNIST: Vision Transformer presets and a small CNN.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "fashion_mnist/dataset.hpp"
#include "gpurun/error.hpp"

namespace gpurun::fashion_mnist {

/// The interface every model of make_model() implements: a torch::nn::Module (parameters(),
/// train()/eval(), to(), torch::save) with a typed forward.
class Classifier : public torch::nn::Module {
 public:
  /// images float32 [B, in_channels, input_size(), input_size()] -> logits float32
  /// [B, num_classes]. Any device and floating dtype the parameters are in.
  virtual torch::Tensor forward(const torch::Tensor& images) = 0;
  /// Height = width in pixels the model expects (BatchOptions::img_size).
  virtual int64_t input_size() const = 0;
};

/// Where and how make_model() builds a model.
struct ModelOptions {
  /// The device the parameters are created on (no CPU copy first: ViT-H's 2.5 GB of float32
  /// would take seconds to initialise on the CPU and more to copy).
  torch::Device device = torch::kCPU;
  /// Random initialisation of the ViT's Linear weights, class token and positions. false:
  /// left uninitialised (torch::empty) — only for a rank whose state is overwritten before its
  /// first step, i.e. when gpurun::Runtime::joining() (docs/worker-runtime.md#cheap-joiners).
  bool init = true;
};

/// A Linear layer (y = x W^T + b; W float32 [out, in], b float32 [out]) whose parameters are
/// created on ModelOptions::device, Xavier-uniform / zero when ModelOptions::init, else left
/// uninitialised. Same parameter names as torch::nn::Linear ("weight", "bias"), so state
/// dicts and checkpoints match.
class Dense : public torch::nn::Module {
 public:
  Dense(int64_t in, int64_t out, const ModelOptions& options);
  /// x [..., in] -> [..., out].
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
};

/// Shape of a Vision Transformer (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words",
/// arXiv:2010.11929, Table 1 for B and H).
struct ViTConfig {
  int64_t img_size = 28;     ///< input height = width, pixels; a multiple of patch
  int64_t patch = 7;         ///< patch height = width, pixels
  int64_t in_channels = 1;   ///< 1 for Fashion-MNIST (grayscale)
  int64_t embed = 64;        ///< token width E; a multiple of heads
  int64_t depth = 4;         ///< transformer blocks
  int64_t heads = 4;         ///< attention heads per block
  int64_t mlp = 128;         ///< hidden width M of each block's MLP
  int64_t num_classes = 10;  ///< logits
};

/// Parameters (weights + biases) of the ViT built from `config`, with T = (img_size/patch)^2 + 1
/// tokens, E = embed, M = mlp, C = num_classes:
///   patch embedding (Conv2d)  E*in_channels*patch^2 + E
///   class token + positions   E + T*E
///   each block                4E^2 + 4E (qkv, proj) + 2EM + M + E (MLP) + 4E (2 LayerNorms)
///   final LayerNorm + head    2E + E*C + C
/// E.g. ViT-B/16 with 3 channels and 1000 classes: 86,567,656 (the paper's "86M"). Throws Error
/// when the config is invalid (see make_vit()).
int64_t vit_param_count(const ViTConfig& config);

/// Pre-norm Vision Transformer: Conv2d(stride = patch) patch embedding, class token, learned
/// position embedding, `depth` blocks of x += MHSA(LN(x)); x += MLP_GELU(LN(x)), final LayerNorm,
/// Linear head on the class token. No dropout. Init: class token and positions N(0, 0.02), Linear
/// weights Xavier-uniform with zero bias, LayerNorm (1, 0), Conv2d PyTorch's default.
class ViT : public Classifier {
 public:
  /// Throws Error on a config with non-positive sizes, img_size not a multiple of patch or embed
  /// not a multiple of heads.
  explicit ViT(const ViTConfig& config, const ModelOptions& options = {});
  torch::Tensor forward(const torch::Tensor& images) override;
  int64_t input_size() const override { return config_.img_size; }
  const ViTConfig& config() const { return config_; }

 private:
  ViTConfig config_;
  torch::nn::Conv2d patch_embed_{nullptr};
  torch::Tensor cls_token_;  // [1, 1, E]
  torch::Tensor pos_embed_;  // [1, T, E]
  torch::nn::ModuleList blocks_;
  torch::nn::LayerNorm norm_{nullptr};
  std::shared_ptr<Dense> head_;
};

/// Two conv blocks (Conv3x3 -> ReLU -> MaxPool2, 32 then 64 channels) and an MLP
/// (3136 -> 128 -> num_classes) on 28x28 inputs; 421,642 parameters for 10 classes.
class SmallCnn : public Classifier {
 public:
  explicit SmallCnn(int64_t num_classes = 10);
  torch::Tensor forward(const torch::Tensor& images) override;
  int64_t input_size() const override { return 28; }

 private:
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::Conv2d conv2_{nullptr};
  torch::nn::Linear fc1_{nullptr};
  torch::nn::Linear fc2_{nullptr};
};

/// Preset names make_model() accepts, in order: "cnn", "tiny", "small", "b", "h".
const std::vector<std::string>& model_names();

/// The ViT config of a ViT preset (1 input channel):
///   tiny   img 28,  patch 7,  embed 64,   depth 4,  heads 4,  mlp 128   (CPU: seconds per epoch)
///   small  img 28,  patch 4,  embed 192,  depth 6,  heads 3,  mlp 768
///   b      img 224, patch 16, embed 768,  depth 12, heads 12, mlp 3072  (ViT-B/16)
///   h      img 224, patch 16, embed 1280, depth 32, heads 16, mlp 5120  (ViT-H/16)
/// "b" and "h" need 224x224 inputs: make_batch upsamples the 28x28 images (BatchOptions).
/// Throws Error listing the ViT preset names for any other name (including "cnn").
ViTConfig vit_preset(const std::string& name, int64_t num_classes = 10);

/// Builds preset `name` (one of model_names()) in float32, in training mode, with its
/// parameters on options.device (the CNN: built on the CPU and moved). Throws Error listing the
/// allowed names for an unknown name. "h" has 2.5 GB of parameters: on the CPU its
/// initialisation takes seconds, on a GPU milliseconds, and none with options.init = false.
std::shared_ptr<Classifier> make_model(const std::string& name, int64_t num_classes = 10,
                                       const ModelOptions& options = {});

/// Total elements of model->parameters().
int64_t count_parameters(const torch::nn::Module& model);

/// `batch.images` on `device`, resized there (bicubic, align_corners=false) to size x size when
/// they are not that size already (28 px images for a 224 px ViT). The copy is non-blocking.
torch::Tensor model_input(const Batch& batch, const torch::Device& device, int64_t size);

/// Sums over evaluated samples (reduce them across ranks before dividing).
struct EvalSums {
  double loss = 0.0;     ///< summed cross-entropy, nats
  double correct = 0.0;  ///< correct top-1 predictions
  double count = 0.0;    ///< samples evaluated
};

/// Evaluates `model` (switched to eval mode, no autograd) on the samples `indices` of `split`,
/// in batches of 500 prepared on `threads` loader threads, on `device` (inputs resized there by
/// model_input). Blocks until done. Throws what make_batch or the model throws.
EvalSums evaluate(Classifier& model, const Split& split, const std::vector<int64_t>& indices,
                  const BatchOptions& options, int threads, const torch::Device& device);

}  // namespace gpurun::fashion_mnist
