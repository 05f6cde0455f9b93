// gpurun::control::preload_libraries_beside — what a standby (docs/control-protocol.md#standby)
// loads while it waits for its go: the parts of the CUDA math libraries that they would
// otherwise open at their first use, after the go, on the resume's critical path. Plain
// dlopen: no CUDA call, no context, the GPU stays at 0 MiB. Shared by both runtimes (the
// Python package through libgpurun_worker.so's gpurun_preload_cuda_libraries).
#pragma once

#include <string>
#include <vector>

namespace gpurun::control {

/// What preload_libraries_beside did.
struct PreloadResult {
  int loaded = 0;                   ///< libraries newly opened
  std::vector<std::string> failed;  ///< "path: dlerror()" for each that would not open
  double seconds = 0;               ///< wall time of the call (s)
};

/// For every library loaded in this process whose file name starts with one of `families`
/// (e.g. "libcudnn") and is versioned (<name>.so.<major>[.…]), opens (dlopen RTLD_NOW |
/// RTLD_LOCAL, never closed) each file or link in that library's directory whose name starts
/// with the same family and resolves to a file of the same major version (libcudnn_ops.so.9
/// beside libcudnn.so.9.10.2; not a cuDNN 8 beside it, nor a .debug file), unless that file is
/// loaded already. A library that opens later by name
/// (cuDNN 9 opens its engine, op and graph libraries at its first handle: hundreds of MB,
/// ~0.3 s of the first step on an H200, bench/first_step_probe.py) then finds it loaded and
/// relocated. A family with no loaded member opens nothing (a CPU-only process). Blocks for
/// the loading (tens of ms for cuDNN's, page cache warm). Never throws: a library that fails to
/// open is listed in `failed` and the rest still open.
PreloadResult preload_libraries_beside(const std::vector<std::string>& families);

/// The families a CUDA standby preloads: cuDNN's and cuBLAS's libraries.
const std::vector<std::string>& cuda_library_families();

}  // namespace gpurun::control
