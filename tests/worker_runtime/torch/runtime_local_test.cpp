// gpurun::Runtime without gpurun (a world of one): the loops, the sampler's partition, the
// prefetch plan and the one-line run() form behave as documented.
#include <doctest/doctest.h>

#include <cstdlib>
#include <map>
#include <vector>

#include <torch/torch.h>

#include "gpurun/error.hpp"
#include "gpurun/runtime.hpp"

namespace {

std::unique_ptr<gpurun::Runtime> local_runtime() {
  for (const char* v : {"GPURUN_ELASTIC", "GPURUN_DEVICE", "GPURUN_SLOT", "RANK", "WORLD_SIZE",
                        "LOCAL_RANK", "GPURUN_TRACE_DIR"})
    ::unsetenv(v);
  return gpurun::Runtime::from_env();
}

}  // namespace

TEST_CASE("runtime without gpurun: one rank, every sample once per epoch, plan == steps") {
  auto rt = local_runtime();
  CHECK(rt->world_size() == 1);
  CHECK(rt->rank() == 0);
  CHECK_FALSE(rt->elastic());
  CHECK(rt->device() == torch::Device(torch::kCPU));
  torch::nn::Linear model(4, 2);
  torch::optim::SGD opt(model->parameters(), 0.1);
  rt->track(*model, opt);
  CHECK_THROWS_AS(rt->track(*model, opt), gpurun::Error);
  rt->sampler(100, {.seed = 9});
  int epochs = 0;
  for (int64_t epoch : rt->epochs(3)) {
    CHECK(epoch == epochs);
    ++epochs;
    const auto plan = rt->upcoming_micro_batches(8);
    std::vector<std::vector<int64_t>> seen_batches;
    std::map<int64_t, int> seen;
    int64_t steps = 0;
    for (const gpurun::Step& step : rt->steps(8)) {
      CHECK(step.epoch == epoch);
      CHECK(step.index == steps);
      ++steps;
      REQUIRE(step.micro_batches.size() == 1);
      CHECK(step.weight(0) == doctest::Approx(1.0));  // one rank, the whole global batch
      seen_batches.push_back(step.micro_batches[0]);
      for (int64_t i : step.micro_batches[0]) ++seen[i];
      opt.zero_grad();
      model->forward(torch::randn({static_cast<int64_t>(step.samples()), 4})).sum().backward();
      rt->all_reduce_gradients();  // a world of one: nothing to average, no error
      opt.step();
    }
    CHECK(steps == 13);  // ceil(100 / 8)
    CHECK(seen.size() == 100);
    for (const auto& [i, n] : seen) CHECK(n == 1);
    CHECK(seen_batches == plan);
    CHECK(rt->all_reduce_sum({1.5, 2.0}) == std::vector<double>{1.5, 2.0});
  }
  CHECK(epochs == 3);
}

TEST_CASE("runtime without gpurun: run() calls the epoch function for each epoch in order") {
  auto rt = local_runtime();
  torch::nn::Linear model(2, 2);
  rt->track(*model);
  std::vector<int64_t> called;
  rt->run(4, [&](int64_t e) { called.push_back(e); });
  CHECK(called == std::vector<int64_t>{0, 1, 2, 3});
  CHECK_THROWS_AS(rt->steps(0), gpurun::Error);
}
