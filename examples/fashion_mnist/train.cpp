// fmnist_train — the main job: a Vision Transformer (or a small CNN) trained on Fashion-MNIST
// under gpurun, elastic through the worker runtime. Rank 0 draws a progress line per epoch
// and evaluates on all 10,000 test images (sharded over the active ranks, then reduced).
//
//   gpurun --nproc 2 --device cpu --config config.toml fmnist_train --model tiny --epochs 5
//   gpurun --nproc 1 --config config.toml fmnist_train --model b --epochs 2 --micro 256
//
// Options (defaults in brackets):
//   --model NAME        cnn | tiny | small | b | h                                [tiny]
//   --epochs N                                                                   [5]
//   --micro B           micro-batch per rank; the global batch is [batch] global
//                       in config.toml, else B x active ranks                    [64]
//   --lr X, --weight-decay X   AdamW (stepped by gpurun::FusedAdamW: torch's fused kernel
//                       on CUDA with LibTorch >= 2, AdamW::step() otherwise)     [1e-3, 0.05]
//   --warmup-steps N    linear learning-rate warmup over the first N optimizer
//                       steps (ViT-B/H need it: without, they stay at chance)   [0]
//   --seed N            model init and the sampler's shuffle                     [42]
//   --data DIR          the four .gz IDX files                [/usr/share/datasets/fashion-mnist]
//   --checkpoint PATH   rank 0 saves the model there at the end (and every
//                       --checkpoint-every N epochs); elasticity never needs it
//   --metrics PATH      rank 0 appends one JSON line per epoch (epoch, gpus, losses,
//                       accuracies, images/s)
//   --limit-train N     train on the first N training images only (quick runs)
//   --build-on-cpu      build and initialise the model on the CPU, then move it (the
//                       slow way, kept to measure against); default: on the device, and
//                       without a random init when rt->joining() (the handoff overwrites it)
//   --timings PATH      every process appends one JSON line: its slot, joining, and the
//                       seconds its runtime, data, model and optimizer took to set up
//   --bf16              CUDA only: forward pass and loss under bfloat16 autocast
//                       (gpurun::CudaAutocast); weights, gradients and AdamW stay float32
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "fashion_mnist/dataset.hpp"
#include "fashion_mnist/models.hpp"
#include "fashion_mnist/progress.hpp"
#include "gpurun/autocast.hpp"
#include "gpurun/check.hpp"
#include "gpurun/fused_adamw.hpp"
#include "gpurun/runtime.hpp"

namespace fm = gpurun::fashion_mnist;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string model = "tiny";
  int64_t epochs = 5;
  int64_t micro = 64;
  double lr = 1e-3;
  double weight_decay = 0.05;
  int64_t warmup_steps = 0;
  uint64_t seed = 42;
  std::string data = fm::kDefaultDataDir;
  bool build_on_cpu = false;
  std::string timings;
  std::string checkpoint;
  int64_t checkpoint_every = 0;
  std::string metrics;
  int64_t limit_train = 0;
  bool bf16 = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::printf(
          "usage: fmnist_train [--model cnn|tiny|small|b|h] [--epochs N] [--micro B] "
          "[--lr X] [--weight-decay X] [--warmup-steps N] [--seed N] [--data DIR] [--checkpoint "
          "PATH] "
          "[--checkpoint-every N] [--metrics PATH] [--limit-train N] [--bf16] [--build-on-cpu] "
          "[--timings PATH]\n");
      std::exit(0);
    }
    if (k == "--bf16") {
      a.bf16 = true;
      continue;
    }
    if (k == "--build-on-cpu") {
      a.build_on_cpu = true;
      continue;
    }
    if (i + 1 >= argc) throw gpurun::Error(fmt::format("{} needs a value", k));
    const std::string v = argv[++i];
    try {
      if (k == "--model")
        a.model = v;
      else if (k == "--epochs")
        a.epochs = std::stoll(v);
      else if (k == "--micro")
        a.micro = std::stoll(v);
      else if (k == "--lr")
        a.lr = std::stod(v);
      else if (k == "--weight-decay")
        a.weight_decay = std::stod(v);
      else if (k == "--warmup-steps")
        a.warmup_steps = std::stoll(v);
      else if (k == "--seed")
        a.seed = std::stoull(v);
      else if (k == "--data")
        a.data = v;
      else if (k == "--checkpoint")
        a.checkpoint = v;
      else if (k == "--checkpoint-every")
        a.checkpoint_every = std::stoll(v);
      else if (k == "--metrics")
        a.metrics = v;
      else if (k == "--timings")
        a.timings = v;
      else if (k == "--limit-train")
        a.limit_train = std::stoll(v);
      else
        throw gpurun::Error(fmt::format("unknown option {} (see --help)", k));
    } catch (const std::logic_error&) {
      throw gpurun::Error(fmt::format("{} {:?} is not a valid value", k, v));
    }
  }
  if (a.epochs < 1 || a.micro < 1) throw gpurun::Error("--epochs and --micro must be at least 1");
  return a;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int run(const Args& a) {
  const auto t_start = Clock::now();
  auto rt = gpurun::Runtime::from_env();
  const double runtime_s = seconds_since(t_start);

  // The data first, then the device: a standby (docs/worker-runtime.md#standby) loads it while
  // its GPU is still free, and waits in device() until a config names its slot.
  auto t_part = Clock::now();
  fm::FashionMnist data = fm::FashionMnist::load(a.data);
  if (a.limit_train > 0 && a.limit_train < data.train.size()) {
    data.train.images = data.train.images.slice(0, 0, a.limit_train);
    data.train.labels = data.train.labels.slice(0, 0, a.limit_train);
  }
  const double data_s = seconds_since(t_part);
  const torch::Device dev = rt->device();
  if (dev.is_cuda()) at::globalContext().setAllowTF32CuBLAS(true);
  const bool bf16 = a.bf16 && dev.is_cuda();
  if (a.bf16 && !bf16 && rt->rank() == 0)
    std::cout << "fmnist_train: --bf16 ignored on device " << dev.str() << " (CUDA only)\n";
  t_part = Clock::now();
  torch::manual_seed(a.seed);
  // Cheap construction (docs/worker-runtime.md#cheap-joiners): parameters made on the device;
  // a rank that receives the state at its first boundary skips the random init it would lose.
  const fm::ModelOptions mopt{.device = a.build_on_cpu ? torch::Device(torch::kCPU) : dev,
                              .init = a.build_on_cpu || !rt->joining()};
  std::shared_ptr<fm::Classifier> model = fm::make_model(a.model, 10, mopt);
  model->to(dev);
  if (dev.is_cuda()) torch::cuda::synchronize(dev.index());  // the init kernels, in model_s
  const double model_s = seconds_since(t_part);
  t_part = Clock::now();
  torch::optim::AdamW opt(model->parameters(),
                          torch::optim::AdamWOptions(a.lr).weight_decay(a.weight_decay));
  gpurun::FusedAdamW fused_step(opt);  // torch's fused kernel on CUDA (LibTorch >= 2)
  rt->track(*model, opt);
  rt->sampler(data.train.size(), {.seed = a.seed});
  if (!a.timings.empty()) {
    std::ofstream(a.timings, std::ios::app) << fmt::format(
        "{{\"slot\":{},\"joining\":{},\"build\":\"{}\",\"init\":{},\"runtime_s\":{:.4f},"
        "\"data_s\":{:.4f},\"model_s\":{:.4f},\"optimizer_s\":{:.4f},\"total_s\":{:.4f}}}\n",
        rt->gpu_id(), rt->joining(), mopt.device.str(), mopt.init, runtime_s, data_s, model_s,
        seconds_since(t_part), seconds_since(t_start));
  }
  const int64_t img = model->input_size();
  fm::BatchOptions bopt{.stats = data.stats, .pin_memory = dev.is_cuda()};

  fm::ProgressLine progress(std::cout, {.tty = fm::ProgressLine::stdout_is_tty()});
  if (rt->rank() == 0)
    std::cout << fmt::format(
                     "fmnist_train: model {} ({:.2f} M parameters), {} train / {} test "
                     "images, device {}{}, {} epochs\n",
                     a.model, fm::count_parameters(*model) / 1e6, data.train.size(),
                     data.test.size(), dev.str(), bf16 ? " (bf16 autocast)" : "", a.epochs)
              << std::flush;

  for (int64_t epoch : rt->epochs(a.epochs)) {
    const bool printer = rt->rank() == 0;
    const auto t0 = Clock::now();
    double loss_sum = 0, correct = 0, seen = 0;
    int64_t mb_done = 0;  // micro-batches done: the progress line's iterations
    std::optional<fm::BatchLoader> loader;
    size_t left = 0;  // micro-batches of the loader's segment not consumed yet
    int64_t plan_generation = -1;
    auto plan_total = [&] {
      return static_cast<int64_t>(rt->upcoming_micro_batches(a.micro).size());
    };
    if (printer)
      progress.begin_epoch(static_cast<int>(epoch) + 1, static_cast<int>(a.epochs), plan_total(),
                           rt->active_gpus());
    model->train();
    for (const gpurun::Step& step : rt->steps(a.micro)) {
      // A resize inside the epoch (a step boundary, or survivors going on after a peer died
      // mid-step) deals the samples anew: drop what was prepared for the old world.
      if (rt->generation() != plan_generation) left = 0;
      if (left == 0) {  // a segment up to the next boundary, prepared ahead on loader threads
        plan_generation = rt->generation();
        auto plan = rt->upcoming_micro_batches(a.micro);
        left = plan.size();
        if (printer) progress.set_total(mb_done + static_cast<int64_t>(left));
        loader.reset();
        loader.emplace(data.train, std::move(plan), bopt,
                       fm::BatchLoaderOptions{.threads = fm::loader_threads(rt->world_size())});
      }
      if (a.warmup_steps > 0) {  // a function of the global step, which moves with the state
        const double f = std::min(1.0, static_cast<double>(step.global_step + 1) / a.warmup_steps);
        for (auto& g : opt.param_groups()) g.options().set_lr(a.lr * f);
      }
      opt.zero_grad();
      for (size_t i = 0; i < step.micro_batches.size(); ++i) {
        std::optional<fm::Batch> b = loader->next();
        --left;
        ++mb_done;
        GPURUN_CHECK(b && b->labels.size(0) == static_cast<int64_t>(step.micro_batches[i].size()),
                     "loader out of step with the runtime at step {}", step.index);
        const torch::Tensor y = b->labels.to(dev, true);
        torch::Tensor logits, loss;
        {
          gpurun::CudaAutocast autocast(bf16);
          logits = model->forward(fm::model_input(*b, dev, img));
          loss = torch::nn::functional::cross_entropy(logits, y);
        }
        (loss * step.weight(i)).backward();
        const double n = static_cast<double>(y.size(0));
        loss_sum += loss.item<double>() * n;
        correct += logits.argmax(1).eq(y).sum().item<double>();
        seen += n;
      }
      rt->all_reduce_gradients();
      fused_step.step();
      if (printer && seen > 0) progress.update(mb_done, {loss_sum / seen, correct / seen});
    }
    // This rank left the job (a resize in release mode, or told to exit while parked): it
    // did not train to the end, so it evaluates and writes nothing.
    if (rt->left()) break;
    const double train_seconds = std::chrono::duration<double>(Clock::now() - t0).count();

    // Evaluate on every test image: rank r of W takes r, r + W, ...; sums reduced.
    std::vector<int64_t> mine;
    for (int64_t i = rt->rank(); i < data.test.size(); i += rt->world_size()) mine.push_back(i);
    fm::EvalSums v;
    {
      gpurun::CudaAutocast autocast(bf16);
      v = fm::evaluate(*model, data.test, mine, bopt, fm::loader_threads(rt->world_size()), dev);
    }
    const auto tot = rt->all_reduce_sum({loss_sum, correct, seen, v.loss, v.correct, v.count});
    if (rt->rank() == 0) {
      const fm::EpochStats val{tot[3] / std::max(1.0, tot[5]), tot[4] / std::max(1.0, tot[5])};
      progress.end_epoch(val);
      if (!a.metrics.empty()) {
        std::ofstream m(a.metrics, std::ios::app);
        m << fmt::format(
            "{{\"epoch\":{},\"gpus\":[{}],\"generation\":{},\"train_loss\":{:.6f},"
            "\"train_acc\":{:.6f},\"val_loss\":{:.6f},\"val_acc\":{:.6f},\"images_per_s\":{:.1f}}}"
            "\n",
            epoch, fmt::join(rt->active_gpus(), ","), rt->generation(),
            tot[0] / std::max(1.0, tot[2]), tot[1] / std::max(1.0, tot[2]), val.loss, val.accuracy,
            tot[2] / std::max(1e-9, train_seconds));
      }
      if (!a.checkpoint.empty() && a.checkpoint_every > 0 && (epoch + 1) % a.checkpoint_every == 0)
        torch::save(std::static_pointer_cast<torch::nn::Module>(model), a.checkpoint);
    }
  }
  if (rt->left()) return 0;
  if (rt->rank() == 0 && !a.checkpoint.empty()) {
    torch::save(std::static_pointer_cast<torch::nn::Module>(model), a.checkpoint);
    std::cout << "fmnist_train: model saved to " << a.checkpoint << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fmnist_train: %s\n", e.what());
    return 1;
  }
}
