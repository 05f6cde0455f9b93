// vit_step_bench — training throughput of the project's ViT presets on synthetic inputs, as a
// plain LibTorch loop (`--mode bare`) or under the gpurun worker runtime (`--mode runtime`).
// The anchor is bench/anchors/ddp_vit.py (the same architecture under PyTorch DDP); the driver
// is scripts/bench-gpu.sh.
//
//   vit_step_bench --mode bare --model h --micro 32 --steps 20 --json bare.json
//   gpurun --nproc 1 --config cfg.toml vit_step_bench --mode runtime --model h --json rt.json
//   gpurun --nproc 1 --device cpu --master-port 0 vit_step_bench --mode runtime --model tiny
//       --micro 8 --steps 3 --device cpu      (one command line)
//
// Each optimizer step: zero_grad; per micro-batch, images [micro, C, S, S] and labels gathered
// (index_select) from a pool of random tensors that lives on the device (no data loading),
// forward + cross-entropy under bfloat16 autocast on CUDA (gpurun::CudaAutocast), backward;
// in runtime mode rt->all_reduce_gradients(); AdamW step. The indices come from a cursor
// (bare) or from rt->steps(micro) over the runtime's sampler (runtime).
//
// Clock: started after `--warmup` optimizer steps (device synchronised), stopped after
// `--steps` more (device synchronised). images/s = world x micro x steps / elapsed.
//
// Options (defaults in brackets):
//   --mode bare|runtime                                                         [bare]
//   --model NAME       a ViT preset of models.hpp: tiny | small | b | h         [h]
//   --micro B          micro-batch per rank (one micro-batch per step)          [32]
//   --steps N          timed optimizer steps                                    [20]
//   --warmup N         untimed optimizer steps before the clock starts          [5]
//   --device cuda|cpu  bare mode: where to train [cuda when available, else cpu];
//                      runtime mode: must match the runtime's device (GPURUN_DEVICE)
//   --no-bf16          float32 forward on CUDA (bf16 autocast is the default; CPU: off)
//   --no-fused         LibTorch's AdamW::step() (a loop of kernels per parameter) instead of
//                      gpurun::FusedAdamW (torch's fused multi-tensor kernel; LibTorch >= 2)
//   --lr X, --weight-decay X   AdamW                                           [1e-4, 0.05]
//   --seed N                                                                    [0]
//   --json PATH        rank 0 writes the result there
//   --step-times       bare mode: print each warm-up step's time (device synchronised, ms):
//                      what a fresh process's first steps cost over the steady ones
//   --prewarm-micro N  bare mode: before the first step, one forward + backward on N samples
//                      (gradients dropped, no optimizer step), timed: how much of the first
//                      step's extra cost a small throwaway step takes away            [0]
//   Runtime mode only (the resize benchmark):
//   --epochs N         epochs of rt->epochs() [1]; every epoch end is a boundary
//   --epoch-steps N    optimizer steps per epoch (sampler size = N x micro x world)
//                      [warmup + steps]
//   --step-log PATH    append {"t_ms","pid","generation","epoch","step"} when each step starts
//   --stop-file PATH   leave the epoch loop at the first epoch start where PATH exists
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "fashion_mnist/models.hpp"
#include "gpurun/autocast.hpp"
#include "gpurun/fused_adamw.hpp"
#include "gpurun/runtime.hpp"

namespace fm = gpurun::fashion_mnist;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string mode = "bare";
  std::string model = "h";
  int64_t micro = 32;
  int64_t steps = 20;
  int64_t warmup = 5;
  std::string device;  // empty: bare mode picks, runtime mode takes the runtime's
  bool bf16 = true;
  bool fused = true;
  double lr = 1e-4;
  double weight_decay = 0.05;
  uint64_t seed = 0;
  std::string json;
  bool step_times = false;
  int64_t prewarm_micro = 0;
  int64_t epochs = 1;
  int64_t epoch_steps = 0;  // 0: warmup + steps
  std::string step_log;
  std::string stop_file;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::printf(
          "usage: vit_step_bench [--mode bare|runtime] [--model tiny|small|b|h] [--micro B] "
          "[--steps N] [--warmup N] [--device cuda|cpu] [--no-bf16] [--no-fused] [--lr X] "
          "[--weight-decay X] "
          "[--seed N] [--json PATH] [--epochs N] [--epoch-steps N] [--step-log PATH] "
          "[--stop-file PATH]\n");
      std::exit(0);
    }
    if (k == "--no-bf16") {
      a.bf16 = false;
      continue;
    }
    if (k == "--no-fused") {
      a.fused = false;
      continue;
    }
    if (k == "--step-times") {
      a.step_times = true;
      continue;
    }
    if (i + 1 >= argc) throw gpurun::Error(fmt::format("{} needs a value (see --help)", k));
    const std::string v = argv[++i];
    try {
      if (k == "--mode")
        a.mode = v;
      else if (k == "--model")
        a.model = v;
      else if (k == "--micro")
        a.micro = std::stoll(v);
      else if (k == "--steps")
        a.steps = std::stoll(v);
      else if (k == "--warmup")
        a.warmup = std::stoll(v);
      else if (k == "--device")
        a.device = v;
      else if (k == "--lr")
        a.lr = std::stod(v);
      else if (k == "--weight-decay")
        a.weight_decay = std::stod(v);
      else if (k == "--seed")
        a.seed = std::stoull(v);
      else if (k == "--json")
        a.json = v;
      else if (k == "--epochs")
        a.epochs = std::stoll(v);
      else if (k == "--epoch-steps")
        a.epoch_steps = std::stoll(v);
      else if (k == "--step-log")
        a.step_log = v;
      else if (k == "--stop-file")
        a.stop_file = v;
      else if (k == "--prewarm-micro")
        a.prewarm_micro = std::stoll(v);
      else
        throw gpurun::Error(fmt::format("unknown option {} (see --help)", k));
    } catch (const std::logic_error&) {
      throw gpurun::Error(fmt::format("{} {:?} is not a valid value", k, v));
    }
  }
  if (a.mode != "bare" && a.mode != "runtime")
    throw gpurun::Error(fmt::format("--mode {:?}: expected bare or runtime", a.mode));
  if (!a.device.empty() && a.device != "cuda" && a.device != "cpu")
    throw gpurun::Error(fmt::format("--device {:?}: expected cuda or cpu", a.device));
  if (a.micro < 1 || a.steps < 1 || a.warmup < 0 || a.epochs < 1 || a.epoch_steps < 0)
    throw gpurun::Error(
        "--micro, --steps and --epochs must be at least 1, --warmup and --epoch-steps at least 0");
  if (a.epoch_steps == 0) a.epoch_steps = a.warmup + a.steps;
  return a;
}

double unix_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(system_clock::now().time_since_epoch()).count();
}

void synchronize(const torch::Device& dev) {
  if (dev.is_cuda()) torch::cuda::synchronize(dev.index());
}

/// Random images and labels on the device; a micro-batch gathers rows of it.
struct SyntheticPool {
  torch::Tensor images;  // float32 [P, C, S, S]
  torch::Tensor labels;  // int64 [P], in [0, classes)

  SyntheticPool(int64_t rows, const fm::ViTConfig& c, const torch::Device& dev) {
    const auto f = torch::TensorOptions().dtype(torch::kFloat).device(dev);
    images = torch::randn({rows, c.in_channels, c.img_size, c.img_size}, f);
    labels = torch::randint(c.num_classes, {rows}, f.dtype(torch::kLong));
  }
  /// Sample indices (any non-negative values; taken modulo the pool size) -> (images, labels).
  std::pair<torch::Tensor, torch::Tensor> gather(const std::vector<int64_t>& indices) const {
    std::vector<int64_t> rows(indices.size());
    for (size_t i = 0; i < indices.size(); ++i) rows[i] = indices[i] % images.size(0);
    const torch::Tensor idx = torch::tensor(rows, torch::kLong).to(images.device());
    return {images.index_select(0, idx), labels.index_select(0, idx)};
  }
};

/// Mean cross-entropy of one micro-batch, forward under autocast when `bf16`.
torch::Tensor loss_of(fm::Classifier& model, const SyntheticPool& pool,
                      const std::vector<int64_t>& indices, bool bf16) {
  auto [x, y] = pool.gather(indices);
  gpurun::CudaAutocast autocast(bf16);
  return torch::nn::functional::cross_entropy(model.forward(x), y);
}

struct Result {
  double seconds = 0;
  int64_t images = 0;  // over the whole world
  double loss_last = 0;
  int world = 1;
};

void report(const Args& a, const fm::ViTConfig& cfg, int64_t params, const torch::Device& dev,
            bool bf16, bool fused, bool elastic, const Result& r) {
  const double ips = static_cast<double>(r.images) / r.seconds;
  const double step_ms = r.seconds * 1e3 / static_cast<double>(a.steps);
  std::printf(
      "vit_step_bench: mode %s, model %s, %s, world %d, micro %lld: %lld steps in %.3f s = %.1f "
      "ms/step, %.1f images/s (last loss %.4f)%s\n",
      a.mode.c_str(), a.model.c_str(), dev.str().c_str(), r.world, static_cast<long long>(a.micro),
      static_cast<long long>(a.steps), r.seconds, step_ms, ips, r.loss_last,
      fused ? ", fused AdamW" : "");
  if (a.json.empty()) return;
  std::ofstream out(a.json);
  out << fmt::format(
      "{{\"bench\":\"vit_step\",\"mode\":\"{}\",\"model\":\"{}\",\"parameters\":{},"
      "\"img_size\":{},\"device\":\"{}\",\"bf16\":{},\"fused_adamw\":{},\"elastic\":{},\"world\":{}"
      ",\"micro\":{},"
      "\"warmup\":{},\"steps\":{},\"seconds\":{:.6f},\"step_ms\":{:.3f},\"images_per_s\":{:.2f},"
      "\"loss_last\":{:.6f},\"libtorch\":\"{}\"}}\n",
      a.mode, a.model, params, cfg.img_size, dev.str(), bf16, fused, elastic, r.world, a.micro,
      a.warmup, a.steps, r.seconds, step_ms, ips, r.loss_last, TORCH_VERSION);
  if (!out) throw gpurun::Error(fmt::format("cannot write {}", a.json));
}

/// The model and optimizer of both modes, built the same way.
struct Trainee {
  fm::ViTConfig cfg;
  std::shared_ptr<fm::Classifier> model;
  std::unique_ptr<torch::optim::AdamW> opt;
  std::unique_ptr<gpurun::FusedAdamW> fused;  // null with --no-fused
  int64_t params = 0;

  void step() {
    if (fused)
      fused->step();
    else
      opt->step();
  }

  Trainee(const Args& a, const torch::Device& dev) : cfg(fm::vit_preset(a.model)) {
    torch::manual_seed(a.seed);
    model = fm::make_model(a.model);
    model->to(dev);
    model->train();
    opt = std::make_unique<torch::optim::AdamW>(
        model->parameters(), torch::optim::AdamWOptions(a.lr).weight_decay(a.weight_decay));
    if (a.fused) fused = std::make_unique<gpurun::FusedAdamW>(*opt);
    params = fm::count_parameters(*model);
  }
};

void print_header(const Args& a, const Trainee& t, const torch::Device& dev, bool bf16) {
  std::printf("vit_step_bench: model %s, parameters: %lld, input %lldx%lldx%lld, device %s%s\n",
              a.model.c_str(), static_cast<long long>(t.params),
              static_cast<long long>(t.cfg.in_channels), static_cast<long long>(t.cfg.img_size),
              static_cast<long long>(t.cfg.img_size), dev.str().c_str(),
              bf16 ? ", bf16 autocast" : "");
  std::fflush(stdout);
}

int run_bare(const Args& a) {
  const bool cuda = a.device.empty() ? torch::cuda::is_available() : a.device == "cuda";
  const torch::Device dev = cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (cuda) at::globalContext().setAllowTF32CuBLAS(true);
  const bool bf16 = a.bf16 && cuda;
  Trainee t(a, dev);
  print_header(a, t, dev, bf16);
  const SyntheticPool pool(std::min<int64_t>(8 * a.micro, a.micro * a.epoch_steps), t.cfg, dev);

  const auto ms_since = [](Clock::time_point from) {
    return std::chrono::duration<double, std::milli>(Clock::now() - from).count();
  };
  synchronize(dev);
  if (a.prewarm_micro > 0) {
    const auto w0 = Clock::now();
    std::vector<int64_t> few(static_cast<size_t>(a.prewarm_micro));
    for (int64_t i = 0; i < a.prewarm_micro; ++i) few[static_cast<size_t>(i)] = i;
    loss_of(*t.model, pool, few, bf16).backward();
    t.opt->zero_grad();
    synchronize(dev);
    std::printf("vit_step_bench: prewarm forward + backward on %lld samples: %.1f ms\n",
                static_cast<long long>(a.prewarm_micro), ms_since(w0));
  }
  Clock::time_point t0;
  torch::Tensor loss;
  std::vector<int64_t> indices(static_cast<size_t>(a.micro));
  std::string times;
  for (int64_t s = 0; s < a.warmup + a.steps; ++s) {
    if (s == a.warmup) {
      synchronize(dev);
      t0 = Clock::now();
    }
    const auto s0 = Clock::now();
    for (int64_t i = 0; i < a.micro; ++i) indices[static_cast<size_t>(i)] = s * a.micro + i;
    t.opt->zero_grad();
    loss = loss_of(*t.model, pool, indices, bf16);
    loss.backward();
    t.step();
    if (a.step_times && s < a.warmup) {
      synchronize(dev);
      times += fmt::format("{}{:.1f}", times.empty() ? "" : " ", ms_since(s0));
    }
  }
  if (a.step_times) std::printf("vit_step_bench: warm-up step times (ms): %s\n", times.c_str());
  synchronize(dev);
  Result r;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.images = a.steps * a.micro;
  r.loss_last = loss.item<double>();
  report(a, t.cfg, t.params, dev, bf16, t.fused && t.fused->fused(), /*elastic=*/false, r);
  return 0;
}

int run_runtime(const Args& a) {
  auto rt = gpurun::Runtime::from_env();
  const torch::Device dev = rt->device();
  if (!a.device.empty() && a.device != (dev.is_cuda() ? "cuda" : "cpu"))
    throw gpurun::Error(fmt::format(
        "--device {} but the runtime's device is {} (gpurun --device / GPURUN_DEVICE decide it)",
        a.device, dev.str()));
  if (dev.is_cuda()) at::globalContext().setAllowTF32CuBLAS(true);
  const bool bf16 = a.bf16 && dev.is_cuda();
  const bool printer = rt->rank() == 0;
  Trainee t(a, dev);
  if (printer) print_header(a, t, dev, bf16);
  rt->track(*t.model, *t.opt);
  rt->sampler(a.epoch_steps * a.micro * rt->world_size(), {.seed = a.seed});
  const SyntheticPool pool(std::min<int64_t>(8 * a.micro, a.micro * a.epoch_steps), t.cfg, dev);

  std::optional<std::ofstream> step_log;
  if (!a.step_log.empty()) step_log.emplace(a.step_log, std::ios::app);
  const int64_t timed_end = a.warmup + a.steps;
  int64_t done = 0;  // optimizer steps this process ran
  Clock::time_point t0;
  torch::Tensor loss;
  std::optional<Result> result;
  for (int64_t epoch : rt->epochs(a.epochs)) {
    if (!a.stop_file.empty() && std::filesystem::exists(a.stop_file)) break;
    for (const gpurun::Step& step : rt->steps(a.micro)) {
      if (step_log) {
        *step_log << fmt::format(
                         "{{\"t_ms\":{:.1f},\"pid\":{},\"generation\":{},\"epoch\":{},\"step\":{},"
                         "\"global_step\":{}}}\n",
                         unix_ms(), ::getpid(), rt->generation(), epoch, step.index,
                         step.global_step)
                  << std::flush;
      }
      if (done == a.warmup) {
        synchronize(dev);
        t0 = Clock::now();
      }
      t.opt->zero_grad();
      for (size_t i = 0; i < step.micro_batches.size(); ++i) {
        loss = loss_of(*t.model, pool, step.micro_batches[i], bf16);
        (loss * step.weight(i)).backward();
      }
      rt->all_reduce_gradients();
      t.step();
      if (++done == timed_end) {
        synchronize(dev);
        Result r;
        r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        r.world = rt->world_size();
        r.images = a.steps * a.micro * r.world;
        r.loss_last = loss.defined() ? loss.item<double>() : 0.0;
        result = r;
      }
    }
  }
  if (rt->left()) return 0;  // this rank left the job (a resize): no result of its own
  if (!result) {
    if (printer)
      std::printf("vit_step_bench: ran %lld steps, fewer than warmup + steps = %lld: no result\n",
                  static_cast<long long>(done), static_cast<long long>(timed_end));
    return 0;
  }
  if (printer)
    report(a, t.cfg, t.params, dev, bf16, t.fused && t.fused->fused(), rt->elastic(), *result);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    return a.mode == "bare" ? run_bare(a) : run_runtime(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vit_step_bench: %s\n", e.what());
    return 1;
  }
}
