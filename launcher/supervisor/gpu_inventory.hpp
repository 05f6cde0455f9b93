// Which GPUs the worker slots map to: CUDA_VISIBLE_DEVICES entries if given,
// else the GPUs the NVIDIA driver reports. Never links CUDA.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpurun::supervisor {

/// Splits a CUDA_VISIBLE_DEVICES value into entries, trimming whitespace.
/// Ids ("3"), UUIDs ("GPU-…") and MIG names ("MIG-…") are kept verbatim.
/// "" gives an empty list (no GPU visible).
std::vector<std::string> parse_visible_devices(std::string_view value);

/// Counts the GPUs on this machine: lines of `nvidia-smi -L` starting with "GPU ",
/// else the entries of /proc/driver/nvidia/gpus; 0 when neither is available.
/// Blocks while nvidia-smi runs (well under a second).
int count_physical_gpus();

/// The GPU id of each slot (physical ids or CUDA_VISIBLE_DEVICES entries).
/// `cuda_visible_devices` is the inherited value (nullopt when unset);
/// `count_gpus` is called only when it is unset.
std::vector<std::string> slot_gpu_ids(const std::optional<std::string>& cuda_visible_devices,
                                      const std::function<int()>& count_gpus);

}  // namespace gpurun::supervisor
