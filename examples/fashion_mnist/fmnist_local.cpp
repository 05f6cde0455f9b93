// fmnist_local: trains one model preset on Fashion-MNIST in this process (no elasticity; CPU by
// default, one GPU with --device cuda) and prints train and test loss/accuracy per epoch: the
// accuracy reference of the elastic job.
//
//   fmnist_local [--model cnn|tiny|small|b|h] [--epochs N] [--batch B] [--lr LR]
//                [--weight-decay WD] [--data DIR] [--train-limit N] [--threads N]
//                [--loader-threads N] [--seed S] [--device cpu|cuda|cuda:K]
#include <torch/torch.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "fashion_mnist/dataset.hpp"
#include "fashion_mnist/models.hpp"
#include "fashion_mnist/progress.hpp"
#include "gpurun/check.hpp"

namespace fm = gpurun::fashion_mnist;

namespace {

struct Args {
  std::string model = "cnn";
  int epochs = 3;
  int64_t batch = 128;
  double lr = 1e-3;
  double weight_decay = 0.05;
  std::string data = fm::kDefaultDataDir;
  int64_t train_limit = 0;  // 0: all 60000
  int threads = 0;          // 0: LibTorch's default
  int loader_threads = 0;   // 0: loader_threads(1)
  uint64_t seed = 1;
  std::string device = "cpu";
};

template <typename T>
T parse_number(std::string_view flag, std::string_view text) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) {
    throw gpurun::UsageError(fmt::format("{}: \"{}\" is not a valid number", flag, text));
  }
  return value;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (i + 1 >= argc) throw gpurun::UsageError(fmt::format("{}: missing value", flag));
    const std::string_view v = argv[++i];
    if (flag == "--model") {
      a.model = v;
    } else if (flag == "--epochs") {
      a.epochs = parse_number<int>(flag, v);
    } else if (flag == "--batch") {
      a.batch = parse_number<int64_t>(flag, v);
    } else if (flag == "--lr") {
      a.lr = parse_number<double>(flag, v);
    } else if (flag == "--weight-decay") {
      a.weight_decay = parse_number<double>(flag, v);
    } else if (flag == "--data") {
      a.data = v;
    } else if (flag == "--train-limit") {
      a.train_limit = parse_number<int64_t>(flag, v);
    } else if (flag == "--threads") {
      a.threads = parse_number<int>(flag, v);
    } else if (flag == "--loader-threads") {
      a.loader_threads = parse_number<int>(flag, v);
    } else if (flag == "--seed") {
      a.seed = parse_number<uint64_t>(flag, v);
    } else if (flag == "--device") {
      a.device = v;
    } else {
      throw gpurun::UsageError(fmt::format("unknown option {}", flag));
    }
  }
  if (a.epochs < 1 || a.batch < 1) {
    throw gpurun::UsageError("--epochs and --batch must be at least 1");
  }
  return a;
}

int run(const Args& args) {
  if (args.threads > 0) torch::set_num_threads(args.threads);
  torch::manual_seed(args.seed);
  const auto data = fm::FashionMnist::load(args.data);
  const torch::Device device(args.device);
  auto model = fm::make_model(args.model);
  model->to(device);
  const int loader = args.loader_threads > 0 ? args.loader_threads : fm::loader_threads(1);
  fmt::print(
      "fmnist_local: model {} ({} parameters, input {}x{}) on {}, {} train / {} test samples, "
      "mean {:.4f} std {:.4f}, batch {}, AdamW lr {} wd {}, {} torch threads, {} loader "
      "threads\n",
      args.model, fm::count_parameters(*model), model->input_size(), model->input_size(),
      device.str(), data.train.size(), data.test.size(), data.stats.mean, data.stats.std,
      args.batch, args.lr, args.weight_decay, torch::get_num_threads(), loader);
  std::cout.flush();

  torch::optim::AdamW optimizer(
      model->parameters(), torch::optim::AdamWOptions(args.lr).weight_decay(args.weight_decay));
  const fm::BatchOptions batch_options{
      .stats = data.stats, .img_size = model->input_size(), .pin_memory = device.is_cuda()};
  const std::vector<int> gpus = device.is_cuda()
                                    ? std::vector<int>{device.has_index() ? device.index() : 0}
                                    : std::vector<int>{};
  fm::ProgressLine progress(std::cout, {.tty = fm::ProgressLine::stdout_is_tty()});
  std::mt19937_64 rng(args.seed);
  std::vector<int64_t> order(static_cast<size_t>(data.train.size()));
  std::iota(order.begin(), order.end(), 0);
  double train_seconds = 0.0;
  for (int epoch = 1; epoch <= args.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    auto epoch_order = order;
    if (args.train_limit > 0 && args.train_limit < data.train.size()) {
      epoch_order.resize(static_cast<size_t>(args.train_limit));
    }
    auto batches = fm::chunk_indices(epoch_order, args.batch);
    const auto steps = static_cast<int64_t>(batches.size());
    const auto start = std::chrono::steady_clock::now();
    fm::BatchLoader train_loader(data.train, std::move(batches), batch_options,
                                 {.threads = loader});
    model->train();
    progress.begin_epoch(epoch, args.epochs, steps, gpus);
    double loss_sum = 0.0;
    int64_t correct = 0;
    int64_t seen = 0;
    int64_t step = 0;
    while (auto b = train_loader.next()) {
      optimizer.zero_grad();
      const auto labels = b->labels.to(device, /*non_blocking=*/true);
      const auto logits = model->forward(b->images.to(device, /*non_blocking=*/true));
      const auto loss = torch::nn::functional::cross_entropy(logits, labels);
      loss.backward();
      optimizer.step();
      const int64_t n = labels.size(0);
      seen += n;
      loss_sum += loss.item<double>() * static_cast<double>(n);
      correct += logits.argmax(1).eq(labels).sum().item<int64_t>();
      progress.update(++step, {loss_sum / static_cast<double>(seen),
                               static_cast<double>(correct) / static_cast<double>(seen)});
    }
    train_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::vector<int64_t> all(static_cast<size_t>(data.test.size()));
    std::iota(all.begin(), all.end(), 0);
    const fm::EvalSums val = fm::evaluate(*model, data.test, all, batch_options, loader, device);
    progress.end_epoch(fm::EpochStats{val.loss / val.count, val.correct / val.count});
  }
  fmt::print(
      "fmnist_local: {} epochs of {}, {:.1f} s/epoch of training (test evaluation not "
      "counted)\n",
      args.epochs, args.model, train_seconds / args.epochs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const gpurun::UsageError& e) {
    std::cerr << "fmnist_local: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "fmnist_local: error: " << e.what() << "\n";
    return 1;
  }
}
