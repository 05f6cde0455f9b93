// first_allreduce — the gpurun half of the "launch -> first all-reduce done" benchmark: join
// the world gpurun started this process in, run one all-reduce through the worker runtime,
// exit. The driver (scripts/bench-gpu.sh) times the whole `gpurun ... first_allreduce`
// command; the anchor is bench/anchors/first_allreduce.py under torchrun.
//
//   gpurun --nproc 1 --config cfg.toml first_allreduce     # elastic: NCCL communicator of 1
//   gpurun --nproc 1 first_allreduce                        # static world of one
//
// What the runtime does here (docs/worker-runtime.md): Runtime::from_env() connects to the
// store (elastic: joins generation 0); the first collective starts the runtime, which in
// elastic mode (or a static world > 1) makes the communicator (NCCL on CUDA, Gloo on the
// CPU), broadcasts rank 0's state (a 1x1 Linear probe) and all-gathers its checksum; then
// all_reduce_sum() sums one float64 per rank on the device. In a static world of one the
// runtime has no communicator and all_reduce_sum() returns its input without any collective:
// the program says which case it ran.
#include <chrono>
#include <cstdio>
#include <exception>

#include <torch/torch.h>

#include "gpurun/runtime.hpp"

int main() {
  try {
    const auto t0 = std::chrono::steady_clock::now();
    auto rt = gpurun::Runtime::from_env();
    torch::nn::Linear probe(1, 1);  // the runtime needs tracked state before its first collective
    probe->to(rt->device());
    rt->track(*probe);
    const std::vector<double> sum = rt->all_reduce_sum({1.0});
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const bool collective = rt->elastic() || rt->world_size() > 1;
    std::printf(
        "first_allreduce: rank %d of %d on %s, %s: sum %.0f (expected %d), %.1f ms from "
        "main() to the result\n",
        rt->rank(), rt->world_size(), rt->device().str().c_str(),
        collective ? "all-reduce through the runtime's communicator"
                   : "static world of one: no communicator, no collective",
        sum.at(0), rt->world_size(), ms);
    return sum.at(0) == rt->world_size() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "first_allreduce: %s\n", e.what());
    return 1;
  }
}
