// gpurun::FusedAdamW: the same parameters and optimizer state as torch::optim::AdamW::step()
// (bitwise on the fallback path, to float rounding on the fused CUDA kernel), including after
// the state was replaced from outside (what a handoff or a pause snapshot does).
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include <torch/torch.h>
#include <torch/version.h>

#include "compat/torch_compat.hpp"
#include "gpurun/fused_adamw.hpp"

namespace {

// Two identical small models (a Linear and a LayerNorm: weights, biases of several shapes).
torch::nn::Sequential make_model(const torch::Device& dev) {
  torch::manual_seed(7);
  torch::nn::Sequential m(torch::nn::Linear(16, 32),
                          torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})),
                          torch::nn::Linear(32, 4));
  m->to(dev);
  return m;
}

void backward_once(torch::nn::Sequential& m, int step, const torch::Device& dev) {
  torch::manual_seed(100 + step);
  const auto x = torch::randn({8, 16}).to(dev);
  m->zero_grad();
  m->forward(x).pow(2).mean().backward();
}

double max_abs_diff(torch::nn::Sequential& a, torch::nn::Sequential& b) {
  double d = 0;
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    d = std::max(d, (pa[i] - pb[i]).abs().max().item<double>());
  return d;
}

torch::optim::AdamWParamState& state_of(torch::optim::AdamW& opt, const torch::Tensor& p) {
  return static_cast<torch::optim::AdamWParamState&>(
      *opt.state().at(gpurun::rt::compat::optimizer_state_key(p)));
}

// Runs 5 steps of plain AdamW and of FusedAdamW on two copies; then replaces both optimizers'
// state of every parameter with a step count of 100 (as a handoff would) and runs 2 more.
void compare(const torch::Device& dev, double tol, bool expect_fused) {
  auto a = make_model(dev), b = make_model(dev);
  const auto opts = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  torch::optim::AdamW plain(a->parameters(), opts), wrapped(b->parameters(), opts);
  gpurun::FusedAdamW fused(wrapped);
  for (int s = 0; s < 5; ++s) {
    backward_once(a, s, dev);
    backward_once(b, s, dev);
    plain.step();
    fused.step();
  }
  CHECK(fused.fused() == expect_fused);
  CHECK(max_abs_diff(a, b) <= tol);
  REQUIRE(wrapped.state().size() == a->parameters().size());
  for (const auto& p : b->parameters()) CHECK(state_of(wrapped, p).step() == 5);

  for (auto* opt : {&plain, &wrapped})
    for (auto& [key, s] : opt->state()) static_cast<torch::optim::AdamWParamState&>(*s).step(100);
  for (int s = 5; s < 7; ++s) {
    backward_once(a, s, dev);
    backward_once(b, s, dev);
    plain.step();
    fused.step();
  }
  CHECK(max_abs_diff(a, b) <= tol);
  for (const auto& p : b->parameters()) CHECK(state_of(wrapped, p).step() == 102);
}

}  // namespace

TEST_CASE("FusedAdamW on CPU falls back to AdamW::step(): bitwise the same") {
  compare(torch::Device(torch::kCPU), 0.0, /*expect_fused=*/false);
}

TEST_CASE("FusedAdamW on CUDA: the fused kernel, AdamW's results to float rounding") {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: skipped");
    return;
  }
  compare(torch::Device(torch::kCUDA, 0), 1e-5, /*expect_fused=*/TORCH_VERSION_MAJOR >= 2);
}
