#include "energy/nvml.hpp"

#include <dlfcn.h>

#include <cstdlib>

#include <fmt/format.h>

#include "gpurun/env_names.hpp"

namespace gpurun::energy {

namespace {

// The C ABI of libnvidia-ml.so.1 (nvml.h), declared here so no NVML header is needed to build:
// nvmlReturn_t is an int-sized enum, nvmlDevice_t an opaque pointer.
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr unsigned kUuidBufferBytes = 96;  // NVML_DEVICE_UUID_V2_BUFFER_SIZE
constexpr unsigned kNameBufferBytes = 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE

using InitFn = nvmlReturn_t (*)();
using ShutdownFn = nvmlReturn_t (*)();
using ErrorStringFn = const char* (*)(nvmlReturn_t);
using GetCountFn = nvmlReturn_t (*)(unsigned*);
using HandleByIndexFn = nvmlReturn_t (*)(unsigned, nvmlDevice_t*);
using HandleByUuidFn = nvmlReturn_t (*)(const char*, nvmlDevice_t*);
using GetStringFn = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned);
using GetU64Fn = nvmlReturn_t (*)(nvmlDevice_t, unsigned long long*);
using GetU32Fn = nvmlReturn_t (*)(nvmlDevice_t, unsigned*);
using GetU32PairFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned*, unsigned*);
using SetU32Fn = nvmlReturn_t (*)(nvmlDevice_t, unsigned);
constexpr nvmlReturn_t kNvmlInsufficientSize = 7;
constexpr nvmlReturn_t kNvmlNotSupported = 3;

}  // namespace

// nvmlProcessInfo_v2_t, the element of nvmlDeviceGetComputeRunningProcesses_v3. Outside the
// anonymous namespace: GCC 13.3 (the GPU machine's) crashes on a member of Nvml::Impl whose
// type names an anonymous-namespace struct in a unity build.
namespace nvml_abi {
struct ProcessInfoV2 {
  unsigned pid;
  unsigned long long used_gpu_memory;  // bytes
  unsigned gpu_instance_id, compute_instance_id;
};
using GetProcessesFn = int (*)(void*, unsigned*, ProcessInfoV2*);
}  // namespace nvml_abi
using nvml_abi::GetProcessesFn;
using nvml_abi::ProcessInfoV2;

struct Nvml::Impl {
  std::string library;
  void* dl = nullptr;
  InitFn init = nullptr;
  ShutdownFn shutdown = nullptr;
  ErrorStringFn error_string = nullptr;
  GetCountFn get_count = nullptr;
  HandleByIndexFn handle_by_index = nullptr;
  HandleByUuidFn handle_by_uuid = nullptr;
  GetStringFn get_uuid = nullptr;
  GetStringFn get_name = nullptr;
  GetU64Fn total_energy = nullptr;
  GetU32Fn power_usage = nullptr;
  GetU32Fn power_limit = nullptr;
  GetU32PairFn power_limit_constraints = nullptr;
  GetU32Fn default_power_limit = nullptr;
  SetU32Fn set_power_limit = nullptr;
  GetProcessesFn compute_processes = nullptr;  ///< optional: older libraries lack it
  /// nvmlDeviceSetGpuLockedClocks(device, min MHz, max MHz) / ResetGpuLockedClocks: optional.
  nvmlReturn_t (*set_locked_clocks)(nvmlDevice_t, unsigned, unsigned) = nullptr;
  nvmlReturn_t (*reset_locked_clocks)(nvmlDevice_t) = nullptr;
  /// nvmlDeviceGetTemperature(device, sensor, °C): optional.
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned*) = nullptr;

  ~Impl() {
    if (dl != nullptr) ::dlclose(dl);
  }

  std::string describe(nvmlReturn_t rc) const {
    const char* s = error_string != nullptr ? error_string(rc) : nullptr;
    return fmt::format("{} (code {})", s != nullptr ? s : "unknown NVML error", rc);
  }

  /// "GPU-…" when NVML can name the device, else its handle.
  std::string who(nvmlDevice_t d) const {
    char buf[kUuidBufferBytes] = {};
    if (get_uuid(d, buf, sizeof buf) == kNvmlSuccess) return buf;
    return fmt::format("handle {}", d);
  }

  [[noreturn]] void fail(const char* function, const std::string& gpu, nvmlReturn_t rc) const {
    throw NvmlError(fmt::format("{} on GPU {}: {}", function, gpu, describe(rc)), rc);
  }
  void check(nvmlReturn_t rc, const char* function, nvmlDevice_t d) const {
    if (rc != kNvmlSuccess) fail(function, who(d), rc);
  }
};

std::unique_ptr<Nvml> Nvml::open(std::string& why_not) {
  auto impl = std::make_unique<Impl>();
  const char* env = std::getenv(gpurun::env::kNvmlLibrary);
  impl->library = env != nullptr && *env != '\0' ? env : "libnvidia-ml.so.1";
  impl->dl = ::dlopen(impl->library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (impl->dl == nullptr) {
    const char* err = ::dlerror();
    why_not = fmt::format("NVML library {} could not be loaded: {}", impl->library,
                          err != nullptr ? err : "unknown dlopen error");
    return nullptr;
  }
  bool ok = true;
  auto resolve = [&](auto& fn, const char* symbol) {
    if (!ok) return;
    ::dlerror();
    void* p = ::dlsym(impl->dl, symbol);
    if (p == nullptr) {
      const char* err = ::dlerror();
      why_not = fmt::format("NVML library {} has no {}: {}", impl->library, symbol,
                            err != nullptr ? err : "null symbol");
      ok = false;
      return;
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  resolve(impl->init, "nvmlInit_v2");
  resolve(impl->shutdown, "nvmlShutdown");
  resolve(impl->error_string, "nvmlErrorString");
  resolve(impl->get_count, "nvmlDeviceGetCount_v2");
  resolve(impl->handle_by_index, "nvmlDeviceGetHandleByIndex_v2");
  resolve(impl->handle_by_uuid, "nvmlDeviceGetHandleByUUID");
  resolve(impl->get_uuid, "nvmlDeviceGetUUID");
  resolve(impl->get_name, "nvmlDeviceGetName");
  resolve(impl->total_energy, "nvmlDeviceGetTotalEnergyConsumption");
  resolve(impl->power_usage, "nvmlDeviceGetPowerUsage");
  resolve(impl->power_limit, "nvmlDeviceGetPowerManagementLimit");
  resolve(impl->power_limit_constraints, "nvmlDeviceGetPowerManagementLimitConstraints");
  resolve(impl->default_power_limit, "nvmlDeviceGetPowerManagementDefaultLimit");
  resolve(impl->set_power_limit, "nvmlDeviceSetPowerManagementLimit");
  if (!ok) return nullptr;
  impl->compute_processes = reinterpret_cast<GetProcessesFn>(
      ::dlsym(impl->dl, "nvmlDeviceGetComputeRunningProcesses_v3"));
  impl->set_locked_clocks = reinterpret_cast<decltype(impl->set_locked_clocks)>(
      ::dlsym(impl->dl, "nvmlDeviceSetGpuLockedClocks"));
  impl->reset_locked_clocks = reinterpret_cast<decltype(impl->reset_locked_clocks)>(
      ::dlsym(impl->dl, "nvmlDeviceResetGpuLockedClocks"));
  impl->temperature =
      reinterpret_cast<decltype(impl->temperature)>(::dlsym(impl->dl, "nvmlDeviceGetTemperature"));
  if (const nvmlReturn_t rc = impl->init(); rc != kNvmlSuccess) {
    why_not = fmt::format("nvmlInit_v2 of {} failed: {}", impl->library, impl->describe(rc));
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(std::move(impl)));
}

Nvml::Nvml(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Nvml::~Nvml() {
  if (impl_) impl_->shutdown();  // ~Impl dlclose()s
}

const std::string& Nvml::library() const {
  return impl_->library;
}

unsigned Nvml::device_count() const {
  unsigned n = 0;
  if (const nvmlReturn_t rc = impl_->get_count(&n); rc != kNvmlSuccess)
    throw NvmlError(
        fmt::format("nvmlDeviceGetCount_v2 of {}: {}", impl_->library, impl_->describe(rc)), rc);
  return n;
}

NvmlDevice Nvml::device_by_index(unsigned index) const {
  nvmlDevice_t d = nullptr;
  if (const nvmlReturn_t rc = impl_->handle_by_index(index, &d); rc != kNvmlSuccess)
    impl_->fail("nvmlDeviceGetHandleByIndex_v2", std::to_string(index), rc);
  return d;
}

NvmlDevice Nvml::device_by_uuid(const std::string& uuid) const {
  nvmlDevice_t d = nullptr;
  if (const nvmlReturn_t rc = impl_->handle_by_uuid(uuid.c_str(), &d); rc != kNvmlSuccess)
    impl_->fail("nvmlDeviceGetHandleByUUID", uuid, rc);
  return d;
}

std::string Nvml::uuid(NvmlDevice d) const {
  char buf[kUuidBufferBytes] = {};
  if (const nvmlReturn_t rc = impl_->get_uuid(d, buf, sizeof buf); rc != kNvmlSuccess)
    impl_->fail("nvmlDeviceGetUUID", fmt::format("handle {}", d), rc);
  return buf;
}

std::string Nvml::name(NvmlDevice d) const {
  char buf[kNameBufferBytes] = {};
  impl_->check(impl_->get_name(d, buf, sizeof buf), "nvmlDeviceGetName", d);
  return buf;
}

uint64_t Nvml::total_energy_mj(NvmlDevice d) const {
  unsigned long long mj = 0;
  impl_->check(impl_->total_energy(d, &mj), "nvmlDeviceGetTotalEnergyConsumption", d);
  return mj;
}

unsigned Nvml::power_mw(NvmlDevice d) const {
  unsigned mw = 0;
  impl_->check(impl_->power_usage(d, &mw), "nvmlDeviceGetPowerUsage", d);
  return mw;
}

unsigned Nvml::temperature_c(NvmlDevice d) const {
  if (impl_->temperature == nullptr)
    throw NvmlError(fmt::format("{} has no nvmlDeviceGetTemperature", impl_->library),
                    kNvmlNotSupported);
  unsigned c = 0;
  constexpr int kTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
  impl_->check(impl_->temperature(d, kTemperatureGpu, &c), "nvmlDeviceGetTemperature", d);
  return c;
}

unsigned Nvml::power_limit_mw(NvmlDevice d) const {
  unsigned mw = 0;
  impl_->check(impl_->power_limit(d, &mw), "nvmlDeviceGetPowerManagementLimit", d);
  return mw;
}

std::pair<unsigned, unsigned> Nvml::power_limit_constraints_mw(NvmlDevice d) const {
  unsigned lo = 0, hi = 0;
  impl_->check(impl_->power_limit_constraints(d, &lo, &hi),
               "nvmlDeviceGetPowerManagementLimitConstraints", d);
  return {lo, hi};
}

unsigned Nvml::default_power_limit_mw(NvmlDevice d) const {
  unsigned mw = 0;
  impl_->check(impl_->default_power_limit(d, &mw), "nvmlDeviceGetPowerManagementDefaultLimit", d);
  return mw;
}

void Nvml::set_power_limit_mw(NvmlDevice d, unsigned milliwatts) const {
  if (const nvmlReturn_t rc = impl_->set_power_limit(d, milliwatts); rc != kNvmlSuccess)
    impl_->fail("nvmlDeviceSetPowerManagementLimit",
                fmt::format("{} (to {} mW)", impl_->who(d), milliwatts), rc);
}

void Nvml::set_gpu_locked_clocks(NvmlDevice d, unsigned min_mhz, unsigned max_mhz) const {
  if (impl_->set_locked_clocks == nullptr)
    throw NvmlError(fmt::format("{} has no nvmlDeviceSetGpuLockedClocks", impl_->library),
                    kNvmlNotSupported);
  if (const nvmlReturn_t rc = impl_->set_locked_clocks(d, min_mhz, max_mhz); rc != kNvmlSuccess)
    impl_->fail("nvmlDeviceSetGpuLockedClocks",
                fmt::format("{} (to {}–{} MHz)", impl_->who(d), min_mhz, max_mhz), rc);
}

void Nvml::reset_gpu_locked_clocks(NvmlDevice d) const {
  if (impl_->reset_locked_clocks == nullptr)
    throw NvmlError(fmt::format("{} has no nvmlDeviceResetGpuLockedClocks", impl_->library),
                    kNvmlNotSupported);
  impl_->check(impl_->reset_locked_clocks(d), "nvmlDeviceResetGpuLockedClocks", d);
}

std::vector<Nvml::Process> Nvml::compute_processes(NvmlDevice d) const {
  if (impl_->compute_processes == nullptr)
    throw NvmlError(
        fmt::format("{} has no nvmlDeviceGetComputeRunningProcesses_v3", impl_->library),
        kNvmlNotSupported);
  std::vector<ProcessInfoV2> infos(16);
  for (int tries = 0;; ++tries) {
    unsigned count = static_cast<unsigned>(infos.size());
    const nvmlReturn_t rc = impl_->compute_processes(d, &count, infos.data());
    if (rc == kNvmlInsufficientSize && tries < 4) {  // more started since: ask again
      infos.resize(static_cast<size_t>(count) + 8);
      continue;
    }
    impl_->check(rc, "nvmlDeviceGetComputeRunningProcesses_v3", d);
    std::vector<Process> out;
    for (unsigned i = 0; i < count && i < infos.size(); ++i)
      out.push_back(
          {infos[i].pid, infos[i].used_gpu_memory == ~0ULL ? 0 : infos[i].used_gpu_memory});
    return out;
  }
}

}  // namespace gpurun::energy
