// gpurun::CudaAutocast: bf16 matmuls on CUDA inside the scope, float32 again after it (also
// after nested scopes), CPU ops never affected, and a weight updated in place between two
// scopes is not served from a stale cast.
#include <doctest/doctest.h>

#include <string>

#include <torch/torch.h>

#include "gpurun/autocast.hpp"

namespace {

// The dtype name of a float32 matmul's result on `dev` ("Float", "BFloat16", "Half").
std::string matmul_dtype(const torch::Device& dev) {
  const auto a = torch::ones({4, 4}, torch::TensorOptions().device(dev));
  return c10::toString(torch::matmul(a, a).scalar_type());
}

}  // namespace

TEST_CASE("CudaAutocast leaves CPU ops in float32, enabled or not, nested or not") {
  const torch::Device cpu(torch::kCPU);
  {
    gpurun::CudaAutocast outer(true);
    CHECK(matmul_dtype(cpu) == "Float");
    {
      gpurun::CudaAutocast inner(false);
      CHECK(matmul_dtype(cpu) == "Float");
    }
  }
  CHECK(matmul_dtype(cpu) == "Float");
}

TEST_CASE("CudaAutocast on CUDA: bf16 inside, float32 after; no stale weight cast") {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: skipped");
    return;
  }
  const torch::Device dev(torch::kCUDA, 0);
  {
    gpurun::CudaAutocast outer(true);
    CHECK(matmul_dtype(dev) == "BFloat16");
    {
      gpurun::CudaAutocast inner(true, torch::kFloat16);
      CHECK(matmul_dtype(dev) == "Half");
    }
    CHECK(matmul_dtype(dev) == "BFloat16");  // the outer dtype is restored
    {
      gpurun::CudaAutocast off(false);  // a disabled scope changes nothing
      CHECK(matmul_dtype(dev) == "BFloat16");
    }
  }
  CHECK(matmul_dtype(dev) == "Float");

  // A leaf weight (requires_grad) is cast once per outermost scope and cached; an in-place
  // update between two scopes must be visible in the second one.
  torch::nn::Linear lin(torch::nn::LinearOptions(4, 1).bias(false));
  lin->to(dev);
  const auto x = torch::ones({1, 4}, torch::TensorOptions().device(dev));
  double first = 0, second = 0;
  {
    gpurun::CudaAutocast ac(true);
    torch::NoGradGuard ng;
    lin->weight.fill_(1.0);
    first = lin(x).item<double>();
  }
  {
    torch::NoGradGuard ng;
    lin->weight.fill_(2.0);
  }
  {
    gpurun::CudaAutocast ac(true);
    second = lin(x).item<double>();
  }
  CHECK(first == doctest::Approx(4.0));
  CHECK(second == doctest::Approx(8.0));
}
