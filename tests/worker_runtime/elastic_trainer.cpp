// A small training binary on the worker runtime, for the integration tests: an MLP on a fixed
// synthetic classification set, trained under the real gpurun with Gloo on CPU.
//
//   elastic_trainer OUT_DIR [--epochs N] [--micro B] [--optimizer adamw|adam|sgd|rmsprop|adagrad]
//                   [--samples N] [--epoch-ms MS] [--hold-at EPOCH:STEP]...
//                   [--width W --depth D]   (D hidden layers of W units; default 32, 1)
// On the device gpurun gives it (GPURUN_DEVICE=cuda: NCCL on the slot's GPU).
//
// --startup-ms MS: a joiner (a process not started in generation 0) sleeps MS before it builds
// its model: a slow start-up (process start, CUDA, model build, data load), which a warm
// joiner spends while the others train.
// --join-delay-ms MS: a joiner sleeps MS inside its first state handoff (after gpurun admitted
// it: the resize's set-up), so that a test can act while the set-up is under way.
// --hold-at E:S: after step S of epoch E (1-based count of steps done), before the boundary
// that may follow it, create OUT_DIR/holding.<gpu> and read a line from the FIFO OUT_DIR/go.E.S
// (made by the test before the start) — so a test can make a config change land exactly at
// that boundary.
//
// Writes into OUT_DIR:
//   indices.<gpu>.<pid>   one line per step: "<epoch> <idx> <idx> ..." (this rank's samples)
//   loss.<gpu>            one line per epoch on rank 0 of that epoch:
//                         "<epoch> <mean train loss> <world> <generation> <checksum>"
// Stops after --epochs, or at the first epoch >= the number in OUT_DIR/stop.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include <torch/torch.h>

#include "gpurun/runtime.hpp"

namespace fs = std::filesystem;

namespace {

long stop_epoch(const fs::path& p) {
  std::ifstream in(p);
  long e = -1;
  return (in >> e) ? e : -1;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> params) {
  if (name == "adamw")
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-2));
  if (name == "adam")
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
  if (name == "sgd")
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  if (name == "rmsprop")
    return std::make_unique<torch::optim::RMSprop>(params, torch::optim::RMSpropOptions(1e-3));
  if (name == "adagrad")
    return std::make_unique<torch::optim::Adagrad>(params, torch::optim::AdagradOptions(0.05));
  if (name == "lbfgs") return std::make_unique<torch::optim::LBFGS>(params);
  throw std::runtime_error("unknown optimizer " + name);
}

}  // namespace

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: elastic_trainer OUT_DIR [options]\n");
    return 2;
  }
  const fs::path out = argv[1];
  int64_t epochs = 1000, micro = 16, samples = 256, epoch_ms = 0, width = 32, depth = 1;
  int64_t join_delay_ms = 0;  // a joiner sleeps inside its first handoff (the set-up)
  int64_t startup_ms = 0;     // a joiner sleeps before it builds its model (start-up)
  std::string opt_name = "adamw";
  std::set<std::pair<int64_t, int64_t>> holds;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--epochs")
      epochs = std::stoll(v);
    else if (k == "--micro")
      micro = std::stoll(v);
    else if (k == "--samples")
      samples = std::stoll(v);
    else if (k == "--epoch-ms")
      epoch_ms = std::stoll(v);
    else if (k == "--width")
      width = std::stoll(v);
    else if (k == "--depth")
      depth = std::stoll(v);
    else if (k == "--optimizer")
      opt_name = v;
    else if (k == "--join-delay-ms")
      join_delay_ms = std::stoll(v);
    else if (k == "--startup-ms")
      startup_ms = std::stoll(v);
    else if (k == "--hold-at")
      holds.emplace(std::stoll(v), std::stoll(v.substr(v.find(':') + 1)));
    else {
      std::fprintf(stderr, "elastic_trainer: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  torch::set_num_threads(1);
  auto rt = gpurun::Runtime::from_env();
  // A joiner: spawned for a later generation (GPURUN_JOIN_GENERATION > 0) or warm (GPURUN_WARM).
  const char* join_gen = std::getenv("GPURUN_JOIN_GENERATION");
  const bool joiner = std::getenv("GPURUN_WARM") || (join_gen && std::string(join_gen) != "0");
  if (joiner && startup_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(startup_ms));

  // The same data on every rank (fixed seed); a different initialisation per slot, so the
  // start broadcast is what makes the replicas equal.
  torch::manual_seed(7);
  const torch::Tensor x_cpu = torch::randn({samples, 16});
  const torch::Tensor y_cpu = torch::matmul(x_cpu, torch::randn({16, 4})).argmax(1);
  const torch::Tensor x = x_cpu.to(rt->device()), y = y_cpu.to(rt->device());
  torch::manual_seed(1000 + rt->gpu_id());
  torch::nn::Sequential model(torch::nn::Linear(16, width), torch::nn::Tanh());
  for (int64_t d = 1; d < depth; ++d) {
    model->push_back(torch::nn::Linear(width, width));
    model->push_back(torch::nn::Tanh());
  }
  model->push_back(torch::nn::Linear(width, 4));
  model->to(rt->device());
  auto opt = make_optimizer(opt_name, model->parameters());
  rt->track(*model, *opt);
  // The epoch's loss statistics are replicated (reduced every step) and move with the state,
  // so an epoch with a mid-epoch resize still reports the loss over all its samples.
  double epoch_loss_sum = 0, epoch_count = 0;
  rt->track_scalar("epoch_loss_sum", &epoch_loss_sum);
  rt->track_scalar("epoch_count", &epoch_count);
  rt->sampler(samples, {.seed = 5});
  // --join-delay-ms: loaded (received) first in a joiner's handoff, once.
  struct SlowFirstLoad : gpurun::StateExtension {
    int64_t ms = 0;
    std::string save() const override { return {}; }
    void load(std::string_view) override {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::exchange(ms, 0)));
    }
  };
  if (joiner && join_delay_ms > 0) {
    auto slow = std::make_shared<SlowFirstLoad>();
    slow->ms = join_delay_ms;
    rt->track_extension("test.join_delay", slow);
  } else if (join_delay_ms > 0) {
    rt->track_extension("test.join_delay", std::make_shared<SlowFirstLoad>());  // same manifest
  }

  const std::string idx_path =
      (out / ("indices." + std::to_string(rt->gpu_id()) + "." + std::to_string(::getpid())))
          .string();
  std::ofstream indices(idx_path, std::ios::app);
  // Preemption: each boundary interval with a checkpoint request, as "epoch step" lines in
  // OUT_DIR/checkpoint.<gpu> (where a program would save its checkpoint).
  bool requested = false;
  const auto note_checkpoint = [&](int64_t epoch, int64_t step) {
    if (rt->checkpoint_requested() && !requested)
      std::ofstream(out / ("checkpoint." + std::to_string(rt->gpu_id())), std::ios::app)
          << epoch << ' ' << step << '\n';
    requested = rt->checkpoint_requested();
  };
  for (int64_t epoch : rt->epochs(epochs)) {
    note_checkpoint(epoch, 0);
    const long stop = stop_epoch(out / "stop");
    if (stop >= 0 && epoch >= stop) break;
    for (const gpurun::Step& step : rt->steps(micro)) {
      if (step.index == 0) epoch_loss_sum = epoch_count = 0;
      note_checkpoint(step.epoch, step.index);
      double loss_sum = 0, count = 0;
      opt->zero_grad();
      indices << step.epoch;
      for (size_t i = 0; i < step.micro_batches.size(); ++i) {
        const auto& mb = step.micro_batches[i];
        for (int64_t k : mb) indices << ' ' << k;
        const torch::Tensor idx = torch::tensor(mb, torch::kLong).to(rt->device());
        const torch::Tensor loss = torch::nn::functional::cross_entropy(
            model->forward(x.index_select(0, idx)), y.index_select(0, idx));
        (loss * step.weight(i)).backward();
        loss_sum += loss.item<double>() * static_cast<double>(mb.size());
        count += static_cast<double>(mb.size());
      }
      indices << '\n' << std::flush;
      rt->all_reduce_gradients();
      opt->step();
      const auto total = rt->all_reduce_sum({loss_sum, count});
      epoch_loss_sum += total[0];
      epoch_count += total[1];
      if (holds.count({step.epoch, step.index + 1})) {
        const std::string tag = std::to_string(step.epoch) + "." + std::to_string(step.index + 1);
        std::ofstream(out / ("holding." + std::to_string(rt->gpu_id()))) << tag;
        // go.<tag>: a FIFO the test made before the start; one line lets this rank go.
        const int fd = ::open((out / ("go." + tag)).c_str(), O_RDONLY | O_CLOEXEC);
        for (char c = 0; fd >= 0;) {
          const ssize_t n = ::read(fd, &c, 1);
          if (n < 0 && errno == EINTR) continue;
          if (n != 1 || c == '\n') break;
        }
        if (fd >= 0) ::close(fd);
      }
    }
    if (rt->left()) break;  // left at a step boundary: write nothing more
    // What a program reads about its place in the job: the current generation's.
    const auto env = [](const char* name) {
      const char* v = std::getenv(name);
      return v ? v : "(unset)";
    };
    std::printf("elastic_trainer gpu %d: epoch %lld env RANK=%s WORLD_SIZE=%s LOCAL_RANK=%s\n",
                rt->gpu_id(), static_cast<long long>(epoch), env("RANK"), env("WORLD_SIZE"),
                env("LOCAL_RANK"));
    std::fflush(stdout);
    if (rt->rank() == 0) {
      std::ofstream loss(out / ("loss." + std::to_string(rt->gpu_id())), std::ios::app);
      loss << epoch << ' ' << std::setprecision(17) << epoch_loss_sum / epoch_count << ' '
           << rt->world_size() << ' ' << rt->generation() << '\n';
    }
    if (epoch_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(epoch_ms));
  }
  if (rt->left()) {  // a leaver (release mode, or told to exit while parked)
    std::printf("elastic_trainer gpu %d: left the job\n", rt->gpu_id());
    return 0;
  }
  if (rt->stop_requested()) {  // gpurun asked to stop (SIGTERM): save, exit 0
    std::ofstream(out / ("stopped." + std::to_string(rt->gpu_id()))) << rt->state_checksum();
    std::printf("elastic_trainer gpu %d: stopped by gpurun\n", rt->gpu_id());
    return 0;
  }
  std::printf("elastic_trainer gpu %d: done\n", rt->gpu_id());
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // gpurun::Error included: a message, not an abort
    std::fprintf(stderr, "elastic_trainer: error: %s\n", e.what());
    return 1;
  }
}
