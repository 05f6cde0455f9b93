// gpurun::FusedAdamW: part of the compat seam (src/compat/): at::_fused_adamw_ exists from
// LibTorch 2.0 on; with 1.13 every step takes AdamW::step().
#include "gpurun/fused_adamw.hpp"

#include <vector>

#include <torch/version.h>

#include "compat/torch_compat.hpp"

namespace gpurun {

#if TORCH_VERSION_MAJOR >= 2

namespace {

// True when every parameter with a gradient in `group` is a CUDA tensor of one device and
// dtype, with a dense gradient of the same: what the fused kernel accepts.
bool fusable(const torch::optim::OptimizerParamGroup& group) {
  const at::Tensor* first = nullptr;
  for (const auto& p : group.params()) {
    if (!p.grad().defined()) continue;
    if (!p.is_cuda() || p.grad().is_sparse() || p.grad().scalar_type() != p.scalar_type())
      return false;
    if (first == nullptr) {
      first = &p;
    } else if (p.device() != first->device() || p.scalar_type() != first->scalar_type()) {
      return false;
    }
  }
  return true;
}

}  // namespace

void FusedAdamW::step() {
  torch::NoGradGuard no_grad;
  auto& groups = opt_.param_groups();
  for (const auto& g : groups) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(g.options());
    if (o.amsgrad() || !fusable(g)) {
      fused_ = false;
      opt_.step();
      return;
    }
  }
  auto& state = opt_.state();
  for (auto& g : groups) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(g.options());
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, counters;
    for (auto& p : g.params()) {
      if (!p.grad().defined()) continue;
      const auto key = rt::compat::optimizer_state_key(p);
      auto it = state.find(key);
      if (it == state.end()) {  // first step of this parameter: AdamW::step()'s lazy init
        auto s = std::make_unique<torch::optim::AdamWParamState>();
        s->step(0);
        s->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        s->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        it = state.emplace(key, std::move(s)).first;
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
      StepCounter& c = steps_[p.unsafeGetTensorImpl()];
      if (!c.value.defined() || c.value.device() != p.device()) {
        c.value =
            torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(p.device()));
        c.mirrors = 0;
      }
      // The state may have been replaced since the last step (a handoff, a pause snapshot):
      // the host-side count is the truth; the device counter follows it.
      if (c.mirrors != s.step()) c.value.fill_(static_cast<double>(s.step()));
      s.step(s.step() + 1);
      c.mirrors = s.step();
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(s.exp_avg());
      exp_avg_sqs.push_back(s.exp_avg_sq());
      counters.push_back(c.value);
    }
    if (params.empty()) continue;
    at::_foreach_add_(counters, 1);  // t of this step, as the kernel reads it
    const auto [beta1, beta2] = o.betas();
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, counters,
                      o.lr(), beta1, beta2, o.weight_decay(), o.eps(), /*amsgrad=*/false,
                      /*maximize=*/false, /*grad_scale=*/std::nullopt, /*found_inf=*/std::nullopt);
  }
  fused_ = true;
}

#else  // LibTorch 1.x: no fused kernel.

void FusedAdamW::step() {
  fused_ = false;
  opt_.step();
}

#endif

}  // namespace gpurun
