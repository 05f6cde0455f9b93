// A user's training binary against an installed gpurun: one epoch of a world of one (no
// gpurun around it), and the error types runtime.hpp promises, caught by their public names.
#include <cstdio>

#include <torch/torch.h>

#include <gpurun/runtime.hpp>

int main() {
  auto rt = gpurun::Runtime::from_env();
  torch::nn::Linear model(4, 2);
  torch::optim::SGD opt(model->parameters(), 0.1);
  rt->track(*model, opt);
  rt->sampler(16, {.seed = 1});
  int64_t samples = 0;
  for (int64_t epoch : rt->epochs(1)) {
    (void)epoch;
    for (const gpurun::Step& step : rt->steps(4)) {
      opt.zero_grad();
      model->forward(torch::randn({step.samples(), 4})).sum().backward();
      rt->all_reduce_gradients();
      opt.step();
      samples += step.samples();
    }
  }
  try {
    rt->track(*model, opt);  // tracked twice: the runtime throws a gpurun::Error
    return 1;
  } catch (const gpurun::Error&) {
  }
  try {
    throw gpurun::CommError("consumer: a collective failed");
  } catch (const gpurun::CommError& e) {
    std::printf("consumer ok: %lld samples, caught gpurun::CommError: %s\n",
                static_cast<long long>(samples), e.what());
  }
  return samples == 16 ? 0 : 1;
}
