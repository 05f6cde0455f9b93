// A worker for multinode_allreduce_test.cpp: one all-reduce of (rank + 1) over the whole job
// through the worker runtime's communicator (Gloo on CPU), then one line on stdout:
//   allreduce rank=<rank> world=<world> node=<GROUP_RANK> master=<MASTER_ADDR> sum=<sum>
// Exits 1 with the error on stderr when the runtime fails.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include <torch/torch.h>

#include "gpurun/runtime.hpp"

int main() {
  try {
    auto rt = gpurun::Runtime::from_env();
    torch::nn::Linear model(1, 1);  // the runtime starts a static job from tracked state
    rt->track(*model);
    const std::vector<double> sum = rt->all_reduce_sum({static_cast<double>(rt->rank() + 1)});
    const char* node = std::getenv("GROUP_RANK");
    const char* master = std::getenv("MASTER_ADDR");
    std::printf("allreduce rank=%d world=%d node=%s master=%s sum=%g\n", rt->rank(),
                rt->world_size(), node ? node : "?", master ? master : "?", sum.at(0));
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_worker: %s\n", e.what());
    return 1;
  }
}
