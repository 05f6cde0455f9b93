// Which NVML device each worker slot trains on: slot i uses the i-th entry of
// CUDA_VISIBLE_DEVICES (or CUDA device i when it is unset), resolved to a UUID and then to
// an NVML handle by UUID — never by position, since CUDA's order (fastest first by default,
// CUDA_DEVICE_ORDER) and NVML's (PCI bus) differ.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "energy/nvml.hpp"

namespace gpurun::energy {

/// One slot's GPU as the monitor sees it.
struct MonitoredGpu {
  int slot = 0;      ///< worker slot (local rank / GPU id in config.toml)
  std::string uuid;  ///< "GPU-…"
  std::string name;  ///< NVML device name, e.g. "NVIDIA H200"
  int index = -1;    ///< NVML device index (DCGM exporter's `gpu` label); -1: unknown
  NvmlDevice device = nullptr;
  unsigned min_limit_mw = 0, max_limit_mw = 0;  ///< power-limit constraints
};

/// UUIDs of the CUDA devices this process would see, in CUDA's order (the driver API:
/// cuInit, cuDeviceGetCount, cuDeviceGet, cuDeviceGetUuid of `$GPURUN_CUDA_LIBRARY` or
/// libcuda.so.1, dlopen()ed; honours CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER of this
/// process). nullopt when the driver cannot be opened or initialised (`why_not` says why).
/// Creates no CUDA context (no GPU memory). Blocks for cuInit (~0.1–1 s).
std::optional<std::vector<std::string>> cuda_visible_uuids(std::string& why_not);

/// Maps `slots` (slot ids 0..n-1) to NVML devices; a slot without a monitored GPU (MIG) is left
/// out of the result. Slot s trains on CUDA device s *after* CUDA_VISIBLE_DEVICES (LOCAL_RANK),
/// which is how each entry is resolved:
/// * `visible`: the CUDA_VISIBLE_DEVICES entries (parse_visible_devices), nullopt when unset;
///   slot s's entry is visible[s] (with `visible` unset: the index s).
/// * An entry "GPU-…" (full UUID or a unique prefix, as CUDA accepts) is looked up among the
///   UUIDs of all NVML devices.
/// * An index entry is resolved through `cuda_uuids`, the UUIDs cuda_visible_uuids() returned in
///   this process (same CUDA_VISIBLE_DEVICES, so already filtered and reordered by CUDA): slot s
///   is cuda_uuids[s]. When `cuda_uuids` is nullopt an index k falls back to NVML index k and
///   `warning` says so (right only with CUDA_DEVICE_ORDER=PCI_BUS_ID).
/// * "MIG-…" entries are not monitored (`warning` names them).
/// `warning` is set to the warnings' sentences joined by "; " (left empty when there are none).
/// Throws gpurun::Error naming the slot and entry when a UUID is unknown to NVML or ambiguous,
/// or an index is out of range; NvmlError when NVML fails.
std::vector<MonitoredGpu> map_slots(const Nvml& nvml, const std::vector<int>& slots,
                                    const std::optional<std::vector<std::string>>& visible,
                                    const std::optional<std::vector<std::string>>& cuda_uuids,
                                    std::string& warning);

}  // namespace gpurun::energy
