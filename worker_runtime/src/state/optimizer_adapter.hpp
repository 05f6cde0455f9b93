// gpurun::rt::OptimizerAdapter — how the state registry reads and writes the per-parameter
// state and the param-group options of one LibTorch optimizer type, without knowing the
// type. Supported: Adam, AdamW, SGD, RMSprop, Adagrad (exact types, not subclasses).
// Internal header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace gpurun::rt {

class OptimizerAdapter {
 public:
  virtual ~OptimizerAdapter() = default;

  /// The adapter of `optimizer`'s exact dynamic type. Throws StateError naming the type
  /// (demangled) for any other optimizer (LBFGS, a user subclass of a supported one, …).
  static std::unique_ptr<OptimizerAdapter> for_optimizer(const torch::optim::Optimizer& optimizer);

  /// "Adam", "AdamW", "SGD", "RMSprop", "Adagrad".
  virtual const std::string& type_name() const = 0;

  /// Names of the param-group options that move, in a fixed order; booleans are 0.0/1.0,
  /// tuples are split (Adam's betas → beta1, beta2):
  ///   Adam, AdamW: lr, beta1, beta2, eps, weight_decay, amsgrad
  ///   SGD:         lr, momentum, dampening, weight_decay, nesterov
  ///   RMSprop:     lr, alpha, eps, weight_decay, momentum, centered
  ///   Adagrad:     lr, lr_decay, weight_decay, initial_accumulator_value, eps
  virtual const std::vector<std::string>& option_names() const = 0;
  /// Values of option_names() in `options` (which must be this type's options class).
  virtual std::vector<double> options(const torch::optim::OptimizerOptions& options) const = 0;
  /// Sets every option of option_names(); `values.size()` == option_names().size().
  virtual void set_options(torch::optim::OptimizerOptions& options,
                           const std::vector<double>& values) const = 0;

  /// Tensor fields of a parameter's state, in canonical order:
  ///   Adam, AdamW: exp_avg, exp_avg_sq, max_exp_avg_sq
  ///   SGD:         momentum_buffer
  ///   RMSprop:     square_avg, momentum_buffer, grad_avg
  ///   Adagrad:     sum
  virtual const std::vector<std::string>& field_names() const = 0;
  /// How many tensor fields, each of its parameter's shape and dtype, one parameter's state
  /// holds after a step under param-group `options` (this type's options class), as LibTorch's
  /// step() creates them (torch/csrc/api/src/optim/{adam,adamw,sgd,rmsprop,adagrad}.cpp):
  ///   Adam, AdamW: 2, 3 with amsgrad;  SGD: 1 with momentum != 0, else 0;
  ///   RMSprop: 1, +1 with momentum > 0, +1 centered;  Adagrad: 1.
  virtual size_t fields_after_step(const torch::optim::OptimizerOptions& options) const = 0;
  /// Whether the state has a step count (all but SGD).
  virtual bool has_step() const = 0;

  /// True when `state` is this type's param state class.
  virtual bool owns(const torch::optim::OptimizerParamState& state) const = 0;
  /// A new, empty param state (step 0, every field undefined).
  virtual std::unique_ptr<torch::optim::OptimizerParamState> make_state() const = 0;
  /// Step count (0 when !has_step()). `state` must satisfy owns().
  virtual int64_t step(const torch::optim::OptimizerParamState& state) const = 0;
  virtual void set_step(torch::optim::OptimizerParamState& state, int64_t step) const = 0;
  /// Field `index` of field_names(); undefined when the state does not use it (e.g.
  /// max_exp_avg_sq without amsgrad). The returned tensor shares the state's storage.
  virtual at::Tensor field(const torch::optim::OptimizerParamState& state, size_t index) const = 0;
  virtual void set_field(torch::optim::OptimizerParamState& state, size_t index,
                         at::Tensor value) const = 0;
};

}  // namespace gpurun::rt
