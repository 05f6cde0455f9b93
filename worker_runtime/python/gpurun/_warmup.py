"""The CUDA libraries and kernels an elastic process needs for its first checksum and first
training step, set up on a thread beside its start (the C++ runtime's cuda_warmup.cpp)."""
import atexit
import sys
import threading

import torch

from ._checksum import _word_sums_many


class _WarmUp:
    """An elastic CUDA process, once its device is set up: what its first checksum and its
    first training step would otherwise set up on their critical path, on a thread while the
    program builds its model and the state arrives (torch releases the GIL in its operations):
    the checksum's kernels (CUDA loads a kernel at its first launch), then cuBLAS/cuBLASLt and
    cuDNN (handles, workspaces, engines) through tiny float32 and bfloat16 linear layers,
    batched products and a strided convolution with their backward, on inputs of ones (the
    CUDA RNG is not used). The C++ runtime does the same (worker_runtime/src/runtime/
    cuda_warmup.cpp). torch hands the handles a thread made back to its pools when the thread
    ends, so the training thread reuses them. ViT-H on an H200: a fresh process's first step
    2.8 s against 0.16 s steady (bench/vit_step_bench --step-times)."""

    def __init__(self, device, slot):
        self._device, self._slot, self._error = device, slot, None
        self._thread = threading.Thread(target=self._run, name="gpurun-warm-up", daemon=True)
        self._thread.start()
        # A process that ends before its first generation (an error, told to exit) must not
        # tear the interpreter down under the thread's cuDNN/cuBLAS set-up.
        atexit.register(self._thread.join, 30)

    def _run(self):
        try:
            dev = self._device
            torch.cuda.set_device(dev)
            # A side stream: nothing here waits for the program's kernels or NCCL's.
            side = torch.cuda.Stream(dev)
            dtypes = (torch.float32, torch.bfloat16) if torch.cuda.is_bf16_supported() else (
                torch.float32,)
            with torch.cuda.stream(side), torch.enable_grad():
                with torch.no_grad():
                    _word_sums_many([torch.zeros(3, dtype=torch.uint8, device=dev),
                                     torch.zeros(2, device=dev)])
                for dtype in dtypes:
                    ones = lambda *shape: torch.ones(*shape, dtype=dtype, device=dev,  # noqa: E731
                                                     requires_grad=True)
                    y = torch.nn.functional.linear(ones(8, 16), ones(32, 16), ones(32))
                    y = y.view(2, 4, 32)
                    torch.matmul(y, y.transpose(1, 2)).sum().backward()
                    torch.nn.functional.conv2d(ones(2, 1, 8, 8), ones(4, 1, 4, 4),
                                               stride=4).sum().backward()
            side.synchronize()
        except Exception as e:  # noqa: BLE001 - only a warm-up: the first step does it instead
            self._error = e

    def finish(self):
        """Waits for the thread (before a generation's first step); prints a failure. Returns
        None (the caller's reference is dropped)."""
        self._thread.join()
        if self._error is not None:
            print(f"gpurun (python, slot {self._slot}): warning: setting up the CUDA libraries "
                  f"ahead of the first step failed ({self._error}); the first step sets them "
                  "up instead", file=sys.stderr, flush=True)
        return None
