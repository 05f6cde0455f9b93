// gpurun::rt::warm_cuda_libraries — the CUDA math libraries a training step uses, set up
// ahead of it. Internal header.
#pragma once

#include <ATen/ATen.h>

namespace gpurun::rt {

/// Sets up what a process's first training step would otherwise set up on its critical path:
/// cuBLAS and cuBLASLt (handles, workspaces) and cuDNN (its handle and engines), by running a
/// few tiny operations on `device` with their backward: float32 and bfloat16 linear layers and
/// batched products, and a strided convolution (inputs of ones: the CUDA RNG is not used).
/// Blocks until the current stream has run them (tens to hundreds of ms the first time, most of it
/// the libraries' own loading). Callable from any thread: torch hands back the handles a thread
/// made to its pools when the thread ends, and the training thread then reuses them. A no-op
/// for a CPU device. Throws what LibTorch throws (e.g. out of memory).
void warm_cuda_libraries(const at::Device& device);

}  // namespace gpurun::rt
