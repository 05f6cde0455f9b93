#include "runtime/cuda_warmup.hpp"

#include <c10/core/DeviceGuard.h>

namespace gpurun::rt {

void warm_cuda_libraries(const at::Device& device) {
  if (!device.is_cuda()) return;
  const c10::DeviceGuard guard(device);
  const at::AutoGradMode grad(true);
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const auto opt = at::TensorOptions().dtype(dtype).device(device);
    const at::Tensor x = at::ones({8, 16}, opt).requires_grad_(true);
    const at::Tensor w = at::ones({32, 16}, opt).requires_grad_(true);
    const at::Tensor b = at::zeros({32}, opt).requires_grad_(true);
    const at::Tensor y = at::linear(x, w, b).view({2, 4, 32});  // addmm: cuBLASLt with a bias
    at::matmul(y, y.transpose(1, 2)).sum().backward();          // batched products
    const at::Tensor img = at::ones({2, 1, 8, 8}, opt).requires_grad_(true);
    const at::Tensor k = at::ones({4, 1, 4, 4}, opt).requires_grad_(true);
    at::conv2d(img, k, {}, 4).sum().backward();  // cuDNN, as a patch embedding
  }
  // Waits for the current stream only (the caller's side stream).
  (void)at::ones({1}, at::TensorOptions().device(device)).sum().item<float>();
}

}  // namespace gpurun::rt
