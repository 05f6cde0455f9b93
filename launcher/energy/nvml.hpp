// gpurun::energy::Nvml — the NVIDIA Management Library opened at run time (dlopen), never
// linked: a machine without the driver runs gpurun with energy monitoring off.
// Tests load the fake library built from launcher/energy/simulated_nvml/ (GPURUN_NVML_LIBRARY).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpurun/error.hpp"

namespace gpurun::energy {

/// An NVML call failed. what(): "<nvmlFunction> on GPU <uuid>: <nvmlErrorString> (code N)".
class NvmlError : public Error {
 public:
  NvmlError(const std::string& what, int code) : Error(what), code_(code) {}
  int code() const { return code_; }  ///< the nvmlReturn_t value
  /// NVML_ERROR_NO_PERMISSION (4): setting a power limit needs root / CAP_SYS_ADMIN.
  bool no_permission() const { return code_ == 4; }
  bool not_supported() const { return code_ == 3; }

 private:
  int code_;
};

/// An opaque device handle (nvmlDevice_t).
using NvmlDevice = void*;

/// Thread safety: NVML itself is thread-safe; this wrapper holds no mutable state after
/// open(), so every method may be called from any thread.
class Nvml {
 public:
  /// dlopen()s `$GPURUN_NVML_LIBRARY` when set, else "libnvidia-ml.so.1", resolves the
  /// functions below and calls nvmlInit_v2. Returns nullptr and sets `why_not` to one
  /// sentence (e.g. "libnvidia-ml.so.1 not found: dlerror text") when any step fails.
  /// Blocks for the library's initialisation (tens of ms on a real driver).
  static std::unique_ptr<Nvml> open(std::string& why_not);
  ~Nvml();  ///< nvmlShutdown + dlclose
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  /// The library path that was opened (for messages).
  const std::string& library() const;

  unsigned device_count() const;                             ///< nvmlDeviceGetCount_v2
  NvmlDevice device_by_index(unsigned index) const;          ///< nvmlDeviceGetHandleByIndex_v2
  NvmlDevice device_by_uuid(const std::string& uuid) const;  ///< nvmlDeviceGetHandleByUUID
  std::string uuid(NvmlDevice d) const;                      ///< "GPU-xxxxxxxx-…"
  std::string name(NvmlDevice d) const;                      ///< e.g. "NVIDIA H200"
  /// Cumulative energy since the driver loaded, millijoules (nvmlDeviceGetTotalEnergyConsumption).
  /// Updates every ~100 ms on an H200; one call costs ~4 ms there: never call it on a hot path.
  uint64_t total_energy_mj(NvmlDevice d) const;
  /// Current board power draw, milliwatts (nvmlDeviceGetPowerUsage; ~1 µs).
  unsigned power_mw(NvmlDevice d) const;
  /// GPU core temperature, °C (nvmlDeviceGetTemperature, NVML_TEMPERATURE_GPU; whole degrees).
  /// Throws NvmlError (not_supported() when the library or GPU has no such reading).
  unsigned temperature_c(NvmlDevice d) const;
  /// Current power limit, milliwatts (nvmlDeviceGetPowerManagementLimit).
  unsigned power_limit_mw(NvmlDevice d) const;
  /// (min, max) settable power limit, milliwatts (nvmlDeviceGetPowerManagementLimitConstraints).
  std::pair<unsigned, unsigned> power_limit_constraints_mw(NvmlDevice d) const;
  /// Factory default limit, milliwatts (nvmlDeviceGetPowerManagementDefaultLimit).
  unsigned default_power_limit_mw(NvmlDevice d) const;
  /// A process using a GPU for compute.
  struct Process {
    unsigned pid = 0;         ///< as the driver sees it (the host's pid namespace)
    uint64_t used_bytes = 0;  ///< its GPU memory, bytes (0 when the driver cannot tell)
  };
  /// The compute processes on `d` (nvmlDeviceGetComputeRunningProcesses_v3). Throws NvmlError
  /// (not_supported() when the library has no such function). ~1 ms on an H200: call it
  /// about once a second, not per sample.
  std::vector<Process> compute_processes(NvmlDevice d) const;
  /// nvmlDeviceSetPowerManagementLimit. Throws NvmlError (no_permission() without root).
  /// Changes a machine-wide setting: only the supervisor and the power guard call it.
  void set_power_limit_mw(NvmlDevice d, unsigned milliwatts) const;
  /// nvmlDeviceSetGpuLockedClocks: the GPU clock held in [min_mhz, max_mhz] MHz. Throws
  /// NvmlError (no_permission() without root; not_supported() when the library or GPU lacks
  /// it). Machine-wide, like a power limit: the supervisor and the power guard only.
  void set_gpu_locked_clocks(NvmlDevice d, unsigned min_mhz, unsigned max_mhz) const;
  /// nvmlDeviceResetGpuLockedClocks: the driver's clock management again. Throws as above.
  void reset_gpu_locked_clocks(NvmlDevice d) const;

  struct Impl;

 private:
  explicit Nvml(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpurun::energy
