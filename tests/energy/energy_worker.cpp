// A training binary on the worker runtime for the energy integration tests: a tiny linear
// model whose every optimizer step also sleeps `--step-ms` divided by the relative speed the
// fake NVML gives its GPU under the current power limit (gpurunFakeNvmlRelativeSpeed), so a
// lower limit makes training measurably slower, as on a real GPU.
//
//   energy_worker OUT_DIR [--epochs N] [--steps S] [--step-ms MS] [--epoch-floor-ms F]
//
// --epoch-floor-ms F: an epoch lasts at least F ms (the rest is slept at its end), so the
// speed-up per GPU stops past S·MS/F GPUs (an input pipeline that delivers no faster), as
// `[energy] scale = "auto"` tests need.
//
// S optimizer steps per epoch at world size 1 (S samples, micro-batch 1, global batch =
// world size). After the epochs() loop — also when the supervisor stopped the job early —
// it writes OUT_DIR/after_loop.<slot> ("<epochs done> <generation>"), the code a user would
// run after training (a final checkpoint).
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <torch/torch.h>

#include "gpurun/runtime.hpp"

namespace fs = std::filesystem;

namespace {

using SpeedFn = int (*)(unsigned, double*);

/// The fake's relative speed of NVML GPU `index` now; 1 without the fake.
double relative_speed(unsigned index) {
  static SpeedFn fn = [] {
    const char* lib = std::getenv("GPURUN_NVML_LIBRARY");
    void* h = lib ? ::dlopen(lib, RTLD_NOW) : nullptr;
    return h ? reinterpret_cast<SpeedFn>(::dlsym(h, "gpurunFakeNvmlRelativeSpeed")) : nullptr;
  }();
  double s = 1;
  if (!fn || fn(index, &s) != 0 || s <= 0) return 1;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: energy_worker OUT_DIR [--epochs N] [--steps S] [--step-ms MS] "
                 "[--epoch-floor-ms F]\n");
    return 2;
  }
  const fs::path out = argv[1];
  int64_t epochs = 3, steps = 10, step_ms = 50, floor_ms = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--epochs")
      epochs = std::stoll(v);
    else if (k == "--steps")
      steps = std::stoll(v);
    else if (k == "--step-ms")
      step_ms = std::stoll(v);
    else if (k == "--epoch-floor-ms")
      floor_ms = std::stoll(v);
    else {
      std::fprintf(stderr, "energy_worker: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  torch::set_num_threads(1);
  auto rt = gpurun::Runtime::from_env();
  torch::manual_seed(3);
  torch::nn::Linear model(4, 2);
  model->to(rt->device());
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01));
  rt->track(*model, opt);
  rt->sampler(steps, {.seed = 1});
  const torch::Tensor x = torch::randn({1, 4}).to(rt->device());
  int64_t done = 0;
  for (int64_t epoch : rt->epochs(epochs)) {
    const auto epoch_start = std::chrono::steady_clock::now();
    for (const gpurun::Step& step : rt->steps(1)) {
      opt.zero_grad();
      if (!step.micro_batches.empty()) model->forward(x).sum().backward();
      rt->all_reduce_gradients();
      opt.step();
      const double speed = relative_speed(static_cast<unsigned>(rt->gpu_id()));
      std::this_thread::sleep_for(std::chrono::microseconds(
          static_cast<int64_t>(static_cast<double>(step_ms) * 1000.0 / speed)));
    }
    std::this_thread::sleep_until(epoch_start + std::chrono::milliseconds(floor_ms));
    if (rt->left()) break;  // left the job (release-mode resize): not trained to the end
    done = epoch + 1;
  }
  if (rt->left()) return 0;
  std::ofstream(out / ("after_loop." + std::to_string(rt->gpu_id())))
      << done << ' ' << rt->generation() << '\n';
  std::printf("energy_worker gpu %d: after the loop (%lld epochs)\n", rt->gpu_id(),
              static_cast<long long>(done));
  return 0;
}
