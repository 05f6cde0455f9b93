// libgpurun_simulated_nvml.so — a fake NVIDIA Management Library *and* CUDA driver subset for
// tests: point both GPURUN_NVML_LIBRARY and GPURUN_CUDA_LIBRARY at it.
//
// Everything it simulates lives in the text file named by $GPURUN_FAKE_NVML_STATE, re-read on
// every call, so several processes (gpurun, its power guard, the test) see the same GPUs.
// Format and formulas: simulated_nvml_state.hpp (a `gpu` line per device with its limits and an
// uncapped-draw schedule, `cuda_order=`, `error <function> <code>`, `energy_period_ms=`).
//
// NVML: same ABI as libnvidia-ml.so.1 (nvmlReturn_t is an int, nvmlDevice_t a pointer, strings
// into caller buffers with a length). Without nvmlInit_v2 device calls return
// NVML_ERROR_UNINITIALIZED; a missing or unreadable state file makes nvmlInit_v2 return
// NVML_ERROR_DRIVER_NOT_LOADED (the reason goes to stderr). Setting a limit outside
// [min_w, max_w] returns NVML_ERROR_INVALID_ARGUMENT, as the driver does.
//
// CUDA: cuInit reads CUDA_VISIBLE_DEVICES (ordinals into cuda_order, `GPU-` UUIDs or unique
// UUID prefixes; the list stops at the first invalid entry, like the driver) and
// CUDA_DEVICE_ORDER (PCI_BUS_ID: NVML order) of the calling process, at every cuInit.
//
// Test extras: gpurunFakeNvmlRelativeSpeed (how fast a worker on that GPU runs now) and
// gpurunFakeNvmlEnergyReads (energy-counter reads by all processes).
#include "simulated_nvml_state.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace fake = gpurun::energy::simulated_nvml;

namespace {

// nvmlReturn_t values (nvml.h).
constexpr int kSuccess = 0;
constexpr int kUninitialized = 1;
constexpr int kInvalidArgument = 2;
constexpr int kNotSupported = 3;
constexpr int kNotFound = 6;
constexpr int kInsufficientSize = 7;
constexpr int kDriverNotLoaded = 9;
constexpr int kUnknown = 999;

// CUresult values (cuda.h).
constexpr int kCudaSuccess = 0;
constexpr int kCudaInvalidValue = 1;
constexpr int kCudaNotInitialized = 3;
constexpr int kCudaNoDevice = 100;
constexpr int kCudaInvalidDevice = 101;
constexpr int kCudaUnknown = 999;

constexpr unsigned kMaxGpus = 64;
char g_handles[kMaxGpus];  // nvmlDevice_t of NVML index i is &g_handles[i]

std::atomic<int> g_nvml_inits{0};
std::mutex g_cuda_mutex;
bool g_cuda_initialised = false;
std::vector<unsigned> g_cuda_visible;  // CUDA ordinal after CUDA_VISIBLE_DEVICES -> NVML index

std::string state_path() {
  const char* p = std::getenv("GPURUN_FAKE_NVML_STATE");
  if (p == nullptr || *p == '\0') throw std::runtime_error("GPURUN_FAKE_NVML_STATE is not set");
  return p;
}

/// The state now; stamps t0 into the file when it has none.
fake::State load() {
  const std::string path = state_path();
  fake::State s = fake::read_state(path);
  if (!s.t0) {
    fake::update_state(path, [&](fake::State& w) {
      if (!w.t0) w.t0 = fake::now_s(w);
      s = w;
    });
  }
  return s;
}

double seconds_since_t0(const fake::State& s) {
  return fake::now_s(s) - *s.t0;
}

void report(const char* function, const std::exception& e) {
  std::fprintf(stderr, "simulated NVML: %s: %s\n", function, e.what());
}

/// Runs `body(state)` for an NVML call: init check, injected errors, exceptions.
template <typename F>
int nvml_call(const char* function, F&& body) {
  if (g_nvml_inits.load() <= 0) return kUninitialized;
  try {
    fake::State s = load();
    if (const auto* e = s.error_for(function, std::nullopt)) return e->code;
    return body(s);
  } catch (const std::exception& e) {
    report(function, e);
    return kUnknown;
  }
}

/// The NVML index of `device`, or -1.
int index_of(const void* device, const fake::State& s) {
  const char* p = static_cast<const char*>(device);
  if (p < g_handles || p >= g_handles + kMaxGpus) return -1;
  const auto i = static_cast<size_t>(p - g_handles);
  return i < s.gpus.size() ? static_cast<int>(i) : -1;
}

/// Runs `body(state, gpu)` for an NVML device call.
template <typename F>
int device_call(const char* function, void* device, F&& body) {
  return nvml_call(function, [&](fake::State& s) {
    const int i = index_of(device, s);
    if (i < 0) return kInvalidArgument;
    if (const auto* e = s.error_for(function, static_cast<unsigned>(i))) return e->code;
    return body(s, s.gpus[static_cast<size_t>(i)]);
  });
}

int copy_string(const std::string& v, char* out, unsigned length) {
  if (out == nullptr) return kInvalidArgument;
  if (v.size() + 1 > length) return kInsufficientSize;
  std::memcpy(out, v.c_str(), v.size() + 1);
  return kSuccess;
}

unsigned to_mw(double w) {
  return static_cast<unsigned>(std::llround(w * 1000.0));
}

/// CUDA ordinals visible to this process: CUDA_VISIBLE_DEVICES over cuda_order.
std::vector<unsigned> cuda_visible(const fake::State& s) {
  std::vector<unsigned> order = s.cuda_order;
  const char* dev_order = std::getenv("CUDA_DEVICE_ORDER");
  if (order.empty() || (dev_order != nullptr && std::string(dev_order) == "PCI_BUS_ID")) {
    order.clear();
    for (unsigned i = 0; i < s.gpus.size(); ++i) order.push_back(i);
  }
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  if (cvd == nullptr) return order;
  std::vector<unsigned> out;
  std::string v(cvd);
  size_t start = 0;
  while (start <= v.size()) {
    size_t end = v.find(',', start);
    if (end == std::string::npos) end = v.size();
    std::string item = v.substr(start, end - start);
    start = end + 1;
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    std::optional<unsigned> nvml_index;
    if (item.rfind("GPU-", 0) == 0) {
      int matches = 0;
      for (const auto& g : s.gpus)
        if (g.uuid.rfind(item, 0) == 0) {
          ++matches;
          nvml_index = g.index;
        }
      if (matches != 1) nvml_index.reset();
    } else if (!item.empty() && item.find_first_not_of("0123456789") == std::string::npos) {
      const unsigned long k = std::strtoul(item.c_str(), nullptr, 10);
      if (k < order.size()) nvml_index = order[k];
    }
    // The driver ignores the rest of the list after an invalid or repeated entry.
    if (!nvml_index || std::find(out.begin(), out.end(), *nvml_index) != out.end()) break;
    out.push_back(*nvml_index);
  }
  return out;
}

}  // namespace

extern "C" {

// ---------------------------------------------------------------- NVML

__attribute__((visibility("default"))) int nvmlInit_v2() {
  try {
    if (const auto* e = load().error_for("nvmlInit_v2", std::nullopt)) return e->code;
  } catch (const std::exception& e) {
    report("nvmlInit_v2", e);
    return kDriverNotLoaded;
  }
  ++g_nvml_inits;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlShutdown() {
  if (g_nvml_inits.load() <= 0) return kUninitialized;
  --g_nvml_inits;
  return kSuccess;
}

__attribute__((visibility("default"))) const char* nvmlErrorString(int result) {
  switch (result) {
    case 0:
      return "Success";
    case 1:
      return "Uninitialized";
    case 2:
      return "Invalid Argument";
    case 3:
      return "Not Supported";
    case 4:
      return "Insufficient Permissions";
    case 5:
      return "Already Initialized";
    case 6:
      return "Not Found";
    case 7:
      return "Insufficient Size";
    case 8:
      return "Insufficient External Power";
    case 9:
      return "Driver Not Loaded";
    case 10:
      return "Timeout";
    case 15:
      return "GPU is lost";
    default:
      return "Unknown Error";
  }
}

__attribute__((visibility("default"))) int nvmlDeviceGetCount_v2(unsigned* count) {
  return nvml_call("nvmlDeviceGetCount_v2", [&](fake::State& s) {
    if (count == nullptr) return kInvalidArgument;
    *count = static_cast<unsigned>(s.gpus.size());
    return kSuccess;
  });
}

__attribute__((visibility("default"))) int nvmlDeviceGetHandleByIndex_v2(unsigned index,
                                                                         void** device) {
  return nvml_call("nvmlDeviceGetHandleByIndex_v2", [&](fake::State& s) {
    if (device == nullptr || index >= s.gpus.size() || index >= kMaxGpus) return kInvalidArgument;
    *device = &g_handles[index];
    return kSuccess;
  });
}

__attribute__((visibility("default"))) int nvmlDeviceGetHandleByUUID(const char* uuid,
                                                                     void** device) {
  return nvml_call("nvmlDeviceGetHandleByUUID", [&](fake::State& s) {
    if (uuid == nullptr || device == nullptr) return kInvalidArgument;
    for (const auto& g : s.gpus)
      if (g.uuid == uuid && g.index < kMaxGpus) {
        *device = &g_handles[g.index];
        return kSuccess;
      }
    return kNotFound;
  });
}

__attribute__((visibility("default"))) int nvmlDeviceGetUUID(void* device, char* uuid,
                                                             unsigned length) {
  return device_call("nvmlDeviceGetUUID", device,
                     [&](fake::State&, fake::Gpu& g) { return copy_string(g.uuid, uuid, length); });
}

__attribute__((visibility("default"))) int nvmlDeviceGetName(void* device, char* name,
                                                             unsigned length) {
  return device_call("nvmlDeviceGetName", device,
                     [&](fake::State&, fake::Gpu& g) { return copy_string(g.name, name, length); });
}

__attribute__((visibility("default"))) int nvmlDeviceGetTotalEnergyConsumption(
    void* device, unsigned long long* energy_mj) {
  return device_call("nvmlDeviceGetTotalEnergyConsumption", device,
                     [&](fake::State& s, fake::Gpu& g) {
                       if (energy_mj == nullptr) return kInvalidArgument;
                       *energy_mj = fake::counter_mj(g, seconds_since_t0(s), s.energy_period_ms);
                       fake::update_state(state_path(), [](fake::State& w) { ++w.energy_reads; });
                       return kSuccess;
                     });
}

__attribute__((visibility("default"))) int nvmlDeviceGetPowerUsage(void* device, unsigned* mw) {
  return device_call("nvmlDeviceGetPowerUsage", device, [&](fake::State& s, fake::Gpu& g) {
    if (mw == nullptr) return kInvalidArgument;
    *mw = to_mw(fake::actual_w(g, seconds_since_t0(s)));
    return kSuccess;
  });
}

__attribute__((visibility("default"))) int nvmlDeviceGetTemperature(void* device, int sensor,
                                                                    unsigned* c) {
  return device_call("nvmlDeviceGetTemperature", device, [&](fake::State& s, fake::Gpu& g) {
    if (c == nullptr || sensor != 0) return kInvalidArgument;  // NVML_TEMPERATURE_GPU only
    const std::optional<double> t = fake::temperature_c(g, seconds_since_t0(s));
    if (!t) return kNotSupported;
    *c = static_cast<unsigned>(std::max(0.0, std::floor(*t)));
    return kSuccess;
  });
}

// nvmlProcessInfo_v2_t (nvml.h), as nvmlDeviceGetComputeRunningProcesses_v3 fills it.
struct ProcessInfo {
  unsigned pid;
  unsigned long long used_gpu_memory;  // bytes
  unsigned gpu_instance_id, compute_instance_id;
};

__attribute__((visibility("default"))) int nvmlDeviceGetComputeRunningProcesses_v3(
    void* device, unsigned* count, ProcessInfo* infos) {
  return device_call("nvmlDeviceGetComputeRunningProcesses_v3", device,
                     [&](fake::State& s, fake::Gpu& g) {
                       if (count == nullptr) return kInvalidArgument;
                       std::vector<ProcessInfo> mine;
                       for (const auto& p : s.processes)
                         if (p.gpu == g.index)
                           mine.push_back({p.pid, p.used_mib << 20, 0xFFFFFFFFu, 0xFFFFFFFFu});
                       const unsigned room = *count;
                       *count = static_cast<unsigned>(mine.size());
                       if (room < mine.size() || (infos == nullptr && !mine.empty()))
                         return kInsufficientSize;
                       for (size_t i = 0; i < mine.size(); ++i) infos[i] = mine[i];
                       return kSuccess;
                     });
}

__attribute__((visibility("default"))) int nvmlDeviceGetPowerManagementLimit(void* device,
                                                                             unsigned* mw) {
  return device_call("nvmlDeviceGetPowerManagementLimit", device, [&](fake::State&, fake::Gpu& g) {
    if (mw == nullptr) return kInvalidArgument;
    *mw = to_mw(fake::current_limit_w(g));
    return kSuccess;
  });
}

__attribute__((visibility("default"))) int nvmlDeviceGetPowerManagementLimitConstraints(
    void* device, unsigned* min_mw, unsigned* max_mw) {
  return device_call("nvmlDeviceGetPowerManagementLimitConstraints", device,
                     [&](fake::State&, fake::Gpu& g) {
                       if (min_mw == nullptr || max_mw == nullptr) return kInvalidArgument;
                       *min_mw = to_mw(g.min_w);
                       *max_mw = to_mw(g.max_w);
                       return kSuccess;
                     });
}

__attribute__((visibility("default"))) int nvmlDeviceGetPowerManagementDefaultLimit(void* device,
                                                                                    unsigned* mw) {
  return device_call("nvmlDeviceGetPowerManagementDefaultLimit", device,
                     [&](fake::State&, fake::Gpu& g) {
                       if (mw == nullptr) return kInvalidArgument;
                       *mw = to_mw(g.default_w);
                       return kSuccess;
                     });
}

__attribute__((visibility("default"))) int nvmlDeviceSetPowerManagementLimit(void* device,
                                                                             unsigned mw) {
  return device_call("nvmlDeviceSetPowerManagementLimit", device, [&](fake::State&, fake::Gpu& g) {
    if (mw < to_mw(g.min_w) || mw > to_mw(g.max_w)) return kInvalidArgument;
    const unsigned index = g.index;
    // Re-read under the exclusive lock: another process may have changed it meanwhile.
    fake::update_state(state_path(), [&](fake::State& w) {
      fake::Gpu& gw = w.gpus.at(index);
      double at = std::max(0.0, fake::now_s(w) - *w.t0);
      if (!gw.limits.empty()) at = std::max(at, gw.limits.back().first);
      gw.limits.emplace_back(at, mw / 1000.0);
    });
    return kSuccess;
  });
}

__attribute__((visibility("default"))) int nvmlDeviceSetGpuLockedClocks(void* device,
                                                                        unsigned min_mhz,
                                                                        unsigned max_mhz) {
  return device_call("nvmlDeviceSetGpuLockedClocks", device, [&](fake::State&, fake::Gpu& g) {
    if (min_mhz == 0 || min_mhz > max_mhz) return kInvalidArgument;
    const unsigned index = g.index;
    fake::update_state(state_path(), [&](fake::State& w) {
      w.gpus.at(index).clocks = std::make_pair(min_mhz, max_mhz);
    });
    return kSuccess;
  });
}

__attribute__((visibility("default"))) int nvmlDeviceResetGpuLockedClocks(void* device) {
  return device_call("nvmlDeviceResetGpuLockedClocks", device, [&](fake::State&, fake::Gpu& g) {
    const unsigned index = g.index;
    fake::update_state(state_path(), [&](fake::State& w) { w.gpus.at(index).clocks.reset(); });
    return kSuccess;
  });
}

// ---------------------------------------------------------------- test extras

/// Speed of a worker on NVML GPU `index` relative to uncapped: (actual/uncapped)^speed_exp
/// now (1.0 when uncapped or idle). Returns an nvmlReturn_t; needs no nvmlInit.
__attribute__((visibility("default"))) int gpurunFakeNvmlRelativeSpeed(unsigned index,
                                                                       double* speed) {
  try {
    fake::State s = load();
    if (speed == nullptr || index >= s.gpus.size()) return kInvalidArgument;
    *speed = fake::relative_speed(s.gpus[index], seconds_since_t0(s));
    return kSuccess;
  } catch (const std::exception& e) {
    report("gpurunFakeNvmlRelativeSpeed", e);
    return kUnknown;
  }
}

/// nvmlDeviceGetTotalEnergyConsumption calls so far by every process on this state file
/// (0 when the file cannot be read).
__attribute__((visibility("default"))) unsigned long long gpurunFakeNvmlEnergyReads() {
  try {
    return load().energy_reads;
  } catch (const std::exception& e) {
    report("gpurunFakeNvmlEnergyReads", e);
    return 0;
  }
}

// ---------------------------------------------------------------- CUDA driver subset

__attribute__((visibility("default"))) int cuInit(unsigned flags) {
  if (flags != 0) return kCudaInvalidValue;
  try {
    fake::State s = load();
    if (const auto* e = s.error_for("cuInit", std::nullopt)) return e->code;
    std::lock_guard<std::mutex> lock(g_cuda_mutex);
    // Unlike the driver, which reads the environment once per process, every cuInit re-reads
    // it, so one test process can try several CUDA_VISIBLE_DEVICES values.
    g_cuda_visible = cuda_visible(s);
    g_cuda_initialised = true;
    return kCudaSuccess;
  } catch (const std::exception& e) {
    report("cuInit", e);
    return kCudaNoDevice;
  }
}

__attribute__((visibility("default"))) int cuDeviceGetCount(int* count) {
  std::lock_guard<std::mutex> lock(g_cuda_mutex);
  if (!g_cuda_initialised) return kCudaNotInitialized;
  if (count == nullptr) return kCudaInvalidValue;
  *count = static_cast<int>(g_cuda_visible.size());
  return kCudaSuccess;
}

__attribute__((visibility("default"))) int cuDeviceGet(int* device, int ordinal) {
  std::lock_guard<std::mutex> lock(g_cuda_mutex);
  if (!g_cuda_initialised) return kCudaNotInitialized;
  if (device == nullptr) return kCudaInvalidValue;
  if (ordinal < 0 || static_cast<size_t>(ordinal) >= g_cuda_visible.size())
    return kCudaInvalidDevice;
  *device = ordinal;
  return kCudaSuccess;
}

/// CUuuid is 16 bytes: the UUID's hex digits, as NVML prints them after "GPU-".
__attribute__((visibility("default"))) int cuDeviceGetUuid_v2(unsigned char* uuid, int device) {
  unsigned nvml_index = 0;
  {
    std::lock_guard<std::mutex> lock(g_cuda_mutex);
    if (!g_cuda_initialised) return kCudaNotInitialized;
    if (uuid == nullptr) return kCudaInvalidValue;
    if (device < 0 || static_cast<size_t>(device) >= g_cuda_visible.size())
      return kCudaInvalidDevice;
    nvml_index = g_cuda_visible[static_cast<size_t>(device)];
  }
  try {
    fake::State s = load();
    if (const auto* e = s.error_for("cuDeviceGetUuid", nvml_index)) return e->code;
    if (nvml_index >= s.gpus.size()) return kCudaInvalidDevice;
    const std::string& text = s.gpus[nvml_index].uuid;
    const auto bytes = fake::uuid_bytes(text);
    if (!bytes) {
      std::fprintf(stderr,
                   "simulated NVML: cuDeviceGetUuid: gpu %u's uuid %s is not "
                   "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (lower-case hex)\n",
                   nvml_index, text.c_str());
      return kCudaUnknown;
    }
    std::memcpy(uuid, bytes->data(), bytes->size());
    return kCudaSuccess;
  } catch (const std::exception& e) {
    report("cuDeviceGetUuid", e);
    return kCudaUnknown;
  }
}

/// The pre-CUDA-11.4 name (cuda.h maps cuDeviceGetUuid to _v2 since then).
__attribute__((visibility("default"))) int cuDeviceGetUuid(unsigned char* uuid, int device) {
  return cuDeviceGetUuid_v2(uuid, device);
}

}  // extern "C"
