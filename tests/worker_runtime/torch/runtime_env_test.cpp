// rt::RuntimeEnv::from_env() and the device it gives: the job slot id names the worker's keys,
// the node-local slot its GPU (docs/cli.md#worker-environment).
#include "runtime/runtime_env.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include <torch/torch.h>

#include "gpurun/error.hpp"
#include "runtime/runtime_seams.hpp"

namespace {

/// Sets the slot variables for one case (nullptr: unset) and unsets them again at its end.
struct SlotVars {
  SlotVars(const char* slot, const char* local, const char* local_rank = nullptr) {
    put("GPURUN_SLOT", slot);
    put("GPURUN_LOCAL_SLOT", local);
    put("LOCAL_RANK", local_rank);
  }
  ~SlotVars() {
    for (const char* v : {"GPURUN_SLOT", "GPURUN_LOCAL_SLOT", "LOCAL_RANK"}) ::unsetenv(v);
  }
  static void put(const char* name, const char* value) {
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
};

}  // namespace

TEST_CASE("runtime env: another node's slot keeps its job id for keys, its local id for the GPU") {
  {
    SlotVars v("1001", "1");  // node 1's local slot 1
    const auto e = gpurun::rt::RuntimeEnv::from_env();
    CHECK(e.slot == 1001);
    CHECK(e.local_slot == 1);
  }
  {
    SlotVars v("2", nullptr);  // an older gpurun, or one node: the local slot is the slot
    const auto e = gpurun::rt::RuntimeEnv::from_env();
    CHECK(e.slot == 2);
    CHECK(e.local_slot == 2);
  }
  {
    SlotVars v(nullptr, nullptr, "3");  // torchrun: LOCAL_RANK
    const auto e = gpurun::rt::RuntimeEnv::from_env();
    CHECK(e.slot == 3);
    CHECK(e.local_slot == 3);
  }
  {
    SlotVars v("1001", "x");
    CHECK_THROWS_WITH_AS(gpurun::rt::RuntimeEnv::from_env(),
                         "environment variable GPURUN_LOCAL_SLOT=\"x\" is not an integer",
                         gpurun::Error);
  }
  {
    SlotVars v("1001", "-1");
    CHECK_THROWS_WITH_AS(gpurun::rt::RuntimeEnv::from_env(),
                         "environment variable GPURUN_LOCAL_SLOT=-1 is not a slot on this node "
                         "(0 or more)",
                         gpurun::Error);
  }
}

TEST_CASE("runtime env: with cuda the device is cuda:<local slot>, not cuda:<job slot>") {
  if (torch::cuda::is_available()) return;  // the check below reads the no-CUDA error's words
  gpurun::detail::RuntimeSeams s;
  s.env.cuda = true;
  s.env.slot = 1001;
  s.env.local_slot = 1;
  CHECK_THROWS_WITH_AS(gpurun::detail::make_runtime(std::move(s)),
                       "GPURUN_DEVICE=cuda but LibTorch sees no CUDA device for slot 1001's "
                       "cuda:1 (a CPU-only LibTorch, or CUDA_VISIBLE_DEVICES is empty)",
                       gpurun::Error);
}
