#include "energy/gpu_map.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gpurun/env_names.hpp"

namespace gpurun::energy {

namespace {

// The CUDA driver API subset (cuda.h), declared here: CUresult is an int-sized enum, CUdevice
// an int, CUuuid 16 bytes. cuda.h maps cuDeviceGetUuid to cuDeviceGetUuid_v2 since CUDA 11.4.
using CUresult = int;
using CUdevice = int;
struct CUuuid {
  unsigned char bytes[16];
};
using CuInitFn = CUresult (*)(unsigned);
using CuDeviceGetCountFn = CUresult (*)(int*);
using CuDeviceGetFn = CUresult (*)(CUdevice*, int);
using CuDeviceGetUuidFn = CUresult (*)(CUuuid*, CUdevice);
using CuGetErrorStringFn = CUresult (*)(CUresult, const char**);

/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lower-case hex, as nvidia-smi and NVML print it.
std::string format_uuid(const CUuuid& u) {
  std::string out = "GPU-";
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[u.bytes[i] >> 4];
    out += kHex[u.bytes[i] & 0xF];
  }
  return out;
}

bool is_index(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos && s.size() < 9;
}

}  // namespace

std::optional<std::vector<std::string>> cuda_visible_uuids(std::string& why_not) {
  const char* env = std::getenv(gpurun::env::kCudaLibrary);
  const std::string library = env != nullptr && *env != '\0' ? env : "libcuda.so.1";
  // Never dlclose()d: unloading a driver after cuInit is unsupported (its threads stay).
  void* dl = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (dl == nullptr) {
    const char* err = ::dlerror();
    why_not = fmt::format("CUDA driver library {} could not be loaded: {}", library,
                          err != nullptr ? err : "unknown dlopen error");
    return std::nullopt;
  }
  auto sym = [&](const char* name) { return ::dlsym(dl, name); };
  auto init = reinterpret_cast<CuInitFn>(sym("cuInit"));
  auto get_count = reinterpret_cast<CuDeviceGetCountFn>(sym("cuDeviceGetCount"));
  auto get = reinterpret_cast<CuDeviceGetFn>(sym("cuDeviceGet"));
  auto get_uuid = reinterpret_cast<CuDeviceGetUuidFn>(sym("cuDeviceGetUuid_v2"));
  if (get_uuid == nullptr) get_uuid = reinterpret_cast<CuDeviceGetUuidFn>(sym("cuDeviceGetUuid"));
  auto error_string = reinterpret_cast<CuGetErrorStringFn>(sym("cuGetErrorString"));
  if (init == nullptr || get_count == nullptr || get == nullptr || get_uuid == nullptr) {
    why_not = fmt::format(
        "CUDA driver library {} lacks cuInit, cuDeviceGetCount, cuDeviceGet or cuDeviceGetUuid",
        library);
    return std::nullopt;
  }
  auto describe = [&](CUresult rc) {
    const char* s = nullptr;
    if (error_string != nullptr) error_string(rc, &s);
    return s != nullptr ? fmt::format("{} (CUresult {})", s, rc) : fmt::format("CUresult {}", rc);
  };
  if (const CUresult rc = init(0); rc != 0) {
    why_not = fmt::format("cuInit of {} failed: {}", library, describe(rc));
    return std::nullopt;
  }
  int count = 0;
  if (const CUresult rc = get_count(&count); rc != 0) {
    why_not = fmt::format("cuDeviceGetCount of {} failed: {}", library, describe(rc));
    return std::nullopt;
  }
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    CUuuid u{};
    if (const CUresult rc = get(&dev, i); rc != 0) {
      why_not = fmt::format("cuDeviceGet({}) of {} failed: {}", i, library, describe(rc));
      return std::nullopt;
    }
    if (const CUresult rc = get_uuid(&u, dev); rc != 0) {
      why_not = fmt::format("cuDeviceGetUuid of CUDA device {} ({}) failed: {}", i, library,
                            describe(rc));
      return std::nullopt;
    }
    out.push_back(format_uuid(u));
  }
  return out;
}

std::vector<MonitoredGpu> map_slots(const Nvml& nvml, const std::vector<int>& slots,
                                    const std::optional<std::vector<std::string>>& visible,
                                    const std::optional<std::vector<std::string>>& cuda_uuids,
                                    std::string& warning) {
  std::vector<std::string> warnings;
  // Every NVML device's UUID, read once when an entry needs a prefix match.
  std::optional<std::vector<std::string>> nvml_uuids;
  auto all_uuids = [&]() -> const std::vector<std::string>& {
    if (!nvml_uuids) {  // set only once complete: a failed listing is tried again
      std::vector<std::string> found;
      const unsigned n = nvml.device_count();
      for (unsigned i = 0; i < n; ++i) found.push_back(nvml.uuid(nvml.device_by_index(i)));
      nvml_uuids = std::move(found);
    }
    return *nvml_uuids;
  };
  auto describe = [&](int slot, const std::string& entry) {
    return visible
               ? fmt::format("slot {} (CUDA_VISIBLE_DEVICES entry '{}')", slot, entry)
               : fmt::format("slot {} (CUDA device {}, CUDA_VISIBLE_DEVICES unset)", slot, slot);
  };
  bool warned_fallback = false;

  std::vector<MonitoredGpu> out;
  for (const int slot : slots) {
    if (slot < 0) throw Error(fmt::format("slot {} is not a valid slot id", slot));
    const auto s = static_cast<size_t>(slot);
    if (visible && s >= visible->size())
      throw Error(fmt::format("slot {} has no CUDA_VISIBLE_DEVICES entry (it lists {} GPUs: '{}')",
                              slot, visible->size(), fmt::join(*visible, ",")));
    const std::string entry = visible ? (*visible)[s] : std::to_string(slot);
    NvmlDevice device = nullptr;
    std::string uuid;
    if (entry.rfind("MIG-", 0) == 0) {
      warnings.push_back(fmt::format(
          "{} is a MIG instance, whose energy NVML does not report: its energy is not monitored",
          describe(slot, entry)));
      continue;
    } else if (entry.rfind("GPU-", 0) == 0) {
      std::vector<std::string> matches;
      for (const auto& u : all_uuids())
        if (u.rfind(entry, 0) == 0) matches.push_back(u);
      if (matches.empty())
        throw Error(fmt::format(
            "{}: no GPU with that UUID; NVML ({}) knows {}", describe(slot, entry), nvml.library(),
            all_uuids().empty() ? std::string("no GPU")
                                : fmt::format("{}", fmt::join(all_uuids(), ", "))));
      if (matches.size() > 1)
        throw Error(fmt::format("{}: the UUID prefix is ambiguous, it matches {}",
                                describe(slot, entry), fmt::join(matches, ", ")));
      uuid = matches.front();
      device = nvml.device_by_uuid(uuid);
    } else if (is_index(entry)) {
      const unsigned k = static_cast<unsigned>(std::stoul(entry));
      if (cuda_uuids) {
        if (s >= cuda_uuids->size())
          throw Error(fmt::format(
              "{}: CUDA sees only {} GPU(s) through CUDA_VISIBLE_DEVICES (it stops at the first "
              "invalid entry), so this slot has none",
              describe(slot, entry), cuda_uuids->size()));
        uuid = (*cuda_uuids)[s];
        try {
          device = nvml.device_by_uuid(uuid);
        } catch (const NvmlError& e) {
          throw Error(fmt::format("{}: CUDA device {} is {}, which NVML cannot find: {}",
                                  describe(slot, entry), slot, uuid, e.what()));
        }
      } else {
        const unsigned n = nvml.device_count();
        if (k >= n)
          throw Error(fmt::format("{}: GPU index {} is out of range, NVML ({}) has {} GPUs",
                                  describe(slot, entry), k, nvml.library(), n));
        if (!warned_fallback) {
          warnings.push_back(
              "the CUDA driver could not be asked for the GPUs' UUIDs, so GPU indices are taken "
              "as NVML indices, which is right only with CUDA_DEVICE_ORDER=PCI_BUS_ID");
          warned_fallback = true;
        }
        device = nvml.device_by_index(k);
        uuid = nvml.uuid(device);
      }
    } else {
      throw Error(
          fmt::format("{}: not a GPU index, GPU-… UUID or MIG-… name", describe(slot, entry)));
    }
    MonitoredGpu g;
    g.slot = slot;
    g.uuid = uuid;
    g.device = device;
    g.name = nvml.name(device);
    try {  // its NVML index: its UUID's position among NVML's devices (/metrics' `gpu`)
      const std::vector<std::string>& all = all_uuids();
      const auto at = std::find(all.begin(), all.end(), uuid);
      if (at != all.end()) g.index = static_cast<int>(at - all.begin());
    } catch (const NvmlError&) {  // a device NVML cannot list: the index stays unknown
    }
    try {
      std::tie(g.min_limit_mw, g.max_limit_mw) = nvml.power_limit_constraints_mw(device);
    } catch (const NvmlError& e) {
      if (!e.not_supported()) throw;  // a GPU without power management: limits stay 0
    }
    for (const MonitoredGpu& other : out)
      if (other.uuid == g.uuid)
        throw Error(fmt::format(
            "slots {} and {} both map to GPU {} (is it listed twice in CUDA_VISIBLE_DEVICES?): "
            "its energy would be counted twice",
            other.slot, slot, g.uuid));
    out.push_back(std::move(g));
  }
  warning = fmt::format("{}", fmt::join(warnings, "; "));
  return out;
}

}  // namespace gpurun::energy
