// StateRegistry's private parts, shared by its sources: state_registry.cpp (tracking, the
// manifest, tensors, checksum, release) and state_registry_snapshot.cpp (snapshot files).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <c10/util/Type.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "compat/torch_compat.hpp"
#include "state/optimizer_adapter.hpp"
#include "state/state_registry.hpp"

namespace gpurun::rt {
namespace detail {

inline std::string shape_text(c10::IntArrayRef shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// ---- tracked things ---------------------------------------------------------------------

struct ModuleTensor {
  std::string name;   ///< "<prefix>.<name in the module>"
  at::Tensor tensor;  ///< shares the module's TensorImpl: set_data() changes the module
  bool is_parameter = false;
  std::vector<int64_t> shape;  ///< remembered across release()
  at::ScalarType dtype = at::kFloat;
};

struct TrackedModule {
  std::string prefix;
  std::vector<ModuleTensor> tensors;  ///< sorted by name
};

struct TrackedOptimizer {
  std::string name;
  torch::optim::Optimizer* optimizer = nullptr;
  std::unique_ptr<OptimizerAdapter> adapter;
};

struct Scalar {
  int64_t* int_value = nullptr;
  double* double_value = nullptr;
  const char* type() const { return int_value != nullptr ? "int64" : "float64"; }
};

// One parameter of an optimizer, with its name in the tracked modules.
struct OptimizerParam {
  at::Tensor param;
  const std::string* name;
};

// The manifest's description of one optimizer state field.
struct FieldSpec {
  bool present = false;
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
};

struct StateSpec {
  int64_t step = 0;
  std::vector<FieldSpec> fields;  ///< adapter's field order
};

/// Installs snapshot::SnapshotFile's pinner: cudaHostRegister through this build's LibTorch
/// seam (compat::HostRegistration; nothing on the CPU). Once per process; any thread.
void install_host_pinner();

}  // namespace detail

struct StateRegistry::Impl {
  using TrackedModule = detail::TrackedModule;
  using TrackedOptimizer = detail::TrackedOptimizer;
  using Scalar = detail::Scalar;
  using OptimizerParam = detail::OptimizerParam;
  std::vector<TrackedModule> modules;
  std::unordered_map<const c10::TensorImpl*, std::string> names;  ///< every tracked tensor
  std::vector<TrackedOptimizer> optimizers;
  std::map<std::string, Scalar> scalars;  ///< name order = manifest order
  std::map<std::string, std::shared_ptr<StateExtension>> extensions;
  bool released = false;
  std::optional<SnapshotFile> snapshot;     ///< the mapped snapshot file, kept across snapshots
  SnapshotStats stats;                      ///< of the last snapshot call
  std::vector<at::Tensor> receive_reserve;  ///< reserve_receive()'s buffers, until used

  /// One of receive_reserve of this shape, dtype and device (removed from it), else a new
  /// uninitialised tensor (state_registry_receive.cpp).
  at::Tensor take_reserved(const std::vector<int64_t>& shape, at::ScalarType dtype,
                           const at::Device& device);

  void check_name_free(const std::string& name) const {
    if (scalars.count(name) != 0 || extensions.count(name) != 0) {
      throw StateError(fmt::format(
          "state name '{}' is tracked twice: scalars and extensions need unique names", name));
    }
  }

  void check_not_released(std::string_view what) const {
    if (released) {
      throw StateError(fmt::format(
          "{}: this rank's state was released (offloaded); it cannot serve as a state source "
          "until apply_manifest() or materialize() gives it storage again",
          what));
    }
  }

  // The optimizer's parameters (all groups, in order) with their tracked names.
  std::vector<OptimizerParam> params_of(const TrackedOptimizer& o) const {
    std::vector<OptimizerParam> out;
    size_t group_index = 0;
    for (const auto& group : o.optimizer->param_groups()) {
      size_t index = 0;
      for (const at::Tensor& p : group.params()) {
        const auto it = names.find(p.unsafeGetTensorImpl());
        if (it == names.end()) {
          throw StateError(fmt::format(
              "optimizer '{}' ({}): parameter {} of param group {} (shape {}) does not belong to "
              "a tracked module: track_module() every module whose parameters it optimizes",
              o.name, o.adapter->type_name(), index, group_index, detail::shape_text(p.sizes())));
        }
        out.push_back({p, &it->second});
        ++index;
      }
      ++group_index;
    }
    return out;
  }

  static torch::optim::OptimizerParamState* state_of(const TrackedOptimizer& o,
                                                     const at::Tensor& p) {
    auto& state = o.optimizer->state();
    const auto it = state.find(compat::optimizer_state_key(p));
    return it == state.end() ? nullptr : it->second.get();
  }

  // A param state of the optimizer that is not of its adapter's type is a gpurun bug or a
  // user who put foreign state in: refuse rather than guess.
  static void check_state_type(const TrackedOptimizer& o,
                               const torch::optim::OptimizerParamState& s,
                               const std::string& param) {
    if (!o.adapter->owns(s)) {
      throw StateError(fmt::format(
          "optimizer '{}' ({}): the state of parameter '{}' has type {}, not the optimizer's own",
          o.name, o.adapter->type_name(), param, c10::demangle(typeid(s).name())));
    }
  }
};

}  // namespace gpurun::rt
