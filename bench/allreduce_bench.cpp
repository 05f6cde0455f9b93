// allreduce_bench — bandwidth of the worker runtime's bucketed gradient all-reduce
// (Runtime::all_reduce_gradients(): pack into flat buckets, one all-reduce per bucket, unpack
// and divide) over a static world started by gpurun. The anchor is bench/anchors/allreduce_bw.py
// (torch.distributed.all_reduce of one tensor of the same size under torchrun); the driver is
// scripts/gpu-multi.sh.
//
//   gpurun --nproc 2 --device cuda --master-port 0 allreduce_bench --mib 256 --json ar.json
//
// The tracked module holds float32 parameters of [1024, 1024] (4 MiB each) totalling --mib;
// every gradient is filled with rank + 1, so after one average it must hold (world + 1) / 2
// everywhere (checked at the end). Clock: --warmup calls untimed, then --iters calls between
// two device synchronisations. Bus bandwidth as nccl-tests defines it for all-reduce:
// busbw = 2 (n - 1) / n x bytes / seconds-per-call (algbw = bytes / seconds-per-call).
//
// Options: --mib N [256]  --iters N [20]  --warmup N [5]  --bucket-mib N [25: the runtime's
// default]  --json PATH (rank 0 writes the result).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include <torch/torch.h>

#include "gpurun/runtime.hpp"

namespace {

struct Grads : torch::nn::Module {
  explicit Grads(int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      register_parameter("p" + std::to_string(i), torch::zeros({1024, 1024}));
  }
};

void sync(const torch::Device& dev) {
  if (dev.is_cuda()) torch::cuda::synchronize(dev.index());
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mib = 256, iters = 20, warmup = 5, bucket_mib = 25;
  std::string json;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mib")
      mib = std::stoll(v);
    else if (k == "--iters")
      iters = std::stoll(v);
    else if (k == "--warmup")
      warmup = std::stoll(v);
    else if (k == "--bucket-mib")
      bucket_mib = std::stoll(v);
    else if (k == "--json")
      json = v;
    else {
      std::fprintf(stderr, "allreduce_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (mib < 4 || iters < 1 || warmup < 0 || bucket_mib < 1) {
    std::fprintf(stderr, "allreduce_bench: need --mib >= 4, --iters >= 1, --bucket-mib >= 1\n");
    return 2;
  }
  try {
    gpurun::RuntimeOptions o;
    o.bucket_bytes = bucket_mib << 20;
    auto rt = gpurun::Runtime::from_env(o);
    const torch::Device dev = rt->device();
    Grads model(mib / 4);
    model.to(dev);
    rt->track(model);
    const int world = rt->world_size();
    const int64_t bytes = (mib / 4) * (int64_t{4} << 20);
    for (auto& p : model.parameters()) p.mutable_grad() = torch::full_like(p, rt->rank() + 1.0);
    for (int64_t i = 0; i < warmup; ++i) rt->all_reduce_gradients();
    sync(dev);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) rt->all_reduce_gradients();
    sync(dev);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double per = s / static_cast<double>(iters);
    const double algbw = static_cast<double>(bytes) / per / 1e9;
    const double busbw = algbw * 2.0 * (world - 1) / world;
    const double want = (world + 1) / 2.0;
    bool ok = true;
    for (auto& p : model.parameters())
      ok = ok && (p.grad() - want).abs().max().item<double>() == 0.0;
    if (rt->rank() != 0) return ok ? 0 : 1;
    std::printf(
        "allreduce_bench: world %d on %s, %.1f MiB of float32 gradients in %lld params, %lld MiB "
        "buckets: %.3f ms per all_reduce_gradients(), algbw %.2f GB/s, busbw %.2f GB/s, "
        "values %s\n",
        world, dev.str().c_str(), static_cast<double>(bytes) / (1 << 20),
        static_cast<long long>(mib / 4), static_cast<long long>(bucket_mib), per * 1e3, algbw,
        busbw, ok ? "correct" : "WRONG");
    if (world < 2) std::printf("allreduce_bench: world of one: the runtime runs no collective\n");
    if (!json.empty()) {
      std::ofstream(json) << "{\"bench\":\"allreduce\",\"impl\":\"gpurun runtime\",\"world\":"
                          << world << ",\"device\":\"" << dev.str() << "\",\"bytes\":" << bytes
                          << ",\"bucket_mib\":" << bucket_mib << ",\"iters\":" << iters
                          << ",\"ms_per_call\":" << per * 1e3 << ",\"algbw_gbps\":" << algbw
                          << ",\"busbw_gbps\":" << busbw
                          << ",\"correct\":" << (ok ? "true" : "false") << "}\n";
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    return 1;
  }
}
