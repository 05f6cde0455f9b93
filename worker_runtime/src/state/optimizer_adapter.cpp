#include "state/optimizer_adapter.hpp"

#include <tuple>
#include <typeinfo>

#include <c10/util/Type.h>
#include <fmt/format.h>

#include "gpurun/check.hpp"
#include "state/state_registry.hpp"

namespace gpurun::rt {
namespace detail {
namespace {

namespace optim = torch::optim;

double as_number(bool b) {
  return b ? 1.0 : 0.0;
}
bool as_bool(double d) {
  return d != 0.0;
}

// One Traits struct per optimizer type: its classes, option and field lists, and accessors
// written against the TORCH_ARG getters/setters (the same in LibTorch 1.13 and 2.x).

template <class Opt, class Opts, class State>
struct AdamLikeTraits {
  using Optimizer = Opt;
  using Options = Opts;
  using ParamState = State;
  static constexpr bool kHasStep = true;
  static std::vector<std::string> option_names() {
    return {"lr", "beta1", "beta2", "eps", "weight_decay", "amsgrad"};
  }
  static std::vector<double> get_options(const Options& o) {
    return {o.lr(),  std::get<0>(o.betas()), std::get<1>(o.betas()),
            o.eps(), o.weight_decay(),       as_number(o.amsgrad())};
  }
  static void set_options(Options& o, const std::vector<double>& v) {
    o.lr(v[0]);
    o.betas(std::make_tuple(v[1], v[2]));
    o.eps(v[3]);
    o.weight_decay(v[4]);
    o.amsgrad(as_bool(v[5]));
  }
  static std::vector<std::string> field_names() {
    return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  }
  static size_t fields_after_step(const Options& o) { return o.amsgrad() ? 3 : 2; }
  static at::Tensor get_field(const State& s, size_t i) {
    switch (i) {
      case 0:
        return s.exp_avg();
      case 1:
        return s.exp_avg_sq();
      default:
        return s.max_exp_avg_sq();
    }
  }
  static void set_field(State& s, size_t i, at::Tensor t) {
    switch (i) {
      case 0:
        s.exp_avg(std::move(t));
        break;
      case 1:
        s.exp_avg_sq(std::move(t));
        break;
      default:
        s.max_exp_avg_sq(std::move(t));
        break;
    }
  }
  static int64_t get_step(const State& s) { return s.step(); }
  static void set_step(State& s, int64_t v) { s.step(v); }
};

struct AdamTraits : AdamLikeTraits<optim::Adam, optim::AdamOptions, optim::AdamParamState> {
  static constexpr const char* kName = "Adam";
};
struct AdamWTraits : AdamLikeTraits<optim::AdamW, optim::AdamWOptions, optim::AdamWParamState> {
  static constexpr const char* kName = "AdamW";
};

struct SgdTraits {
  using Optimizer = optim::SGD;
  using Options = optim::SGDOptions;
  using ParamState = optim::SGDParamState;
  static constexpr const char* kName = "SGD";
  static constexpr bool kHasStep = false;
  static std::vector<std::string> option_names() {
    return {"lr", "momentum", "dampening", "weight_decay", "nesterov"};
  }
  static std::vector<double> get_options(const Options& o) {
    return {o.lr(), o.momentum(), o.dampening(), o.weight_decay(), as_number(o.nesterov())};
  }
  static void set_options(Options& o, const std::vector<double>& v) {
    o.lr(v[0]);
    o.momentum(v[1]);
    o.dampening(v[2]);
    o.weight_decay(v[3]);
    o.nesterov(as_bool(v[4]));
  }
  static std::vector<std::string> field_names() { return {"momentum_buffer"}; }
  static size_t fields_after_step(const Options& o) { return o.momentum() != 0 ? 1 : 0; }
  static at::Tensor get_field(const ParamState& s, size_t) { return s.momentum_buffer(); }
  static void set_field(ParamState& s, size_t, at::Tensor t) { s.momentum_buffer(std::move(t)); }
  static int64_t get_step(const ParamState&) { return 0; }
  static void set_step(ParamState&, int64_t) {}
};

struct RmspropTraits {
  using Optimizer = optim::RMSprop;
  using Options = optim::RMSpropOptions;
  using ParamState = optim::RMSpropParamState;
  static constexpr const char* kName = "RMSprop";
  static constexpr bool kHasStep = true;
  static std::vector<std::string> option_names() {
    return {"lr", "alpha", "eps", "weight_decay", "momentum", "centered"};
  }
  static std::vector<double> get_options(const Options& o) {
    return {o.lr(), o.alpha(), o.eps(), o.weight_decay(), o.momentum(), as_number(o.centered())};
  }
  static void set_options(Options& o, const std::vector<double>& v) {
    o.lr(v[0]);
    o.alpha(v[1]);
    o.eps(v[2]);
    o.weight_decay(v[3]);
    o.momentum(v[4]);
    o.centered(as_bool(v[5]));
  }
  static std::vector<std::string> field_names() {
    return {"square_avg", "momentum_buffer", "grad_avg"};
  }
  static size_t fields_after_step(const Options& o) {
    return 1 + (o.momentum() > 0 ? 1 : 0) + (o.centered() ? 1 : 0);
  }
  static at::Tensor get_field(const ParamState& s, size_t i) {
    switch (i) {
      case 0:
        return s.square_avg();
      case 1:
        return s.momentum_buffer();
      default:
        return s.grad_avg();
    }
  }
  static void set_field(ParamState& s, size_t i, at::Tensor t) {
    switch (i) {
      case 0:
        s.square_avg(std::move(t));
        break;
      case 1:
        s.momentum_buffer(std::move(t));
        break;
      default:
        s.grad_avg(std::move(t));
        break;
    }
  }
  static int64_t get_step(const ParamState& s) { return s.step(); }
  static void set_step(ParamState& s, int64_t v) { s.step(v); }
};

struct AdagradTraits {
  using Optimizer = optim::Adagrad;
  using Options = optim::AdagradOptions;
  using ParamState = optim::AdagradParamState;
  static constexpr const char* kName = "Adagrad";
  static constexpr bool kHasStep = true;
  static std::vector<std::string> option_names() {
    return {"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"};
  }
  static std::vector<double> get_options(const Options& o) {
    return {o.lr(), o.lr_decay(), o.weight_decay(), o.initial_accumulator_value(), o.eps()};
  }
  static void set_options(Options& o, const std::vector<double>& v) {
    o.lr(v[0]);
    o.lr_decay(v[1]);
    o.weight_decay(v[2]);
    o.initial_accumulator_value(v[3]);
    o.eps(v[4]);
  }
  static std::vector<std::string> field_names() { return {"sum"}; }
  static size_t fields_after_step(const Options&) { return 1; }
  static at::Tensor get_field(const ParamState& s, size_t) { return s.sum(); }
  static void set_field(ParamState& s, size_t, at::Tensor t) { s.sum(std::move(t)); }
  static int64_t get_step(const ParamState& s) { return s.step(); }
  static void set_step(ParamState& s, int64_t v) { s.step(v); }
};

template <class Traits>
class TypedAdapter final : public OptimizerAdapter {
  using Options = typename Traits::Options;
  using ParamState = typename Traits::ParamState;

 public:
  const std::string& type_name() const override { return name_; }
  const std::vector<std::string>& option_names() const override { return option_names_; }

  std::vector<double> options(const optim::OptimizerOptions& options) const override {
    return Traits::get_options(typed(options));
  }
  void set_options(optim::OptimizerOptions& options,
                   const std::vector<double>& values) const override {
    GPURUN_CHECK(values.size() == option_names_.size(), "{} options: {} values for {} names", name_,
                 values.size(), option_names_.size());
    Traits::set_options(typed(options), values);
  }

  const std::vector<std::string>& field_names() const override { return field_names_; }
  size_t fields_after_step(const optim::OptimizerOptions& options) const override {
    return Traits::fields_after_step(typed(options));
  }
  bool has_step() const override { return Traits::kHasStep; }

  bool owns(const optim::OptimizerParamState& state) const override {
    return dynamic_cast<const ParamState*>(&state) != nullptr;
  }
  std::unique_ptr<optim::OptimizerParamState> make_state() const override {
    return std::make_unique<ParamState>();
  }
  int64_t step(const optim::OptimizerParamState& state) const override {
    return Traits::get_step(typed(state));
  }
  void set_step(optim::OptimizerParamState& state, int64_t step) const override {
    Traits::set_step(typed(state), step);
  }
  at::Tensor field(const optim::OptimizerParamState& state, size_t index) const override {
    GPURUN_CHECK(index < field_names_.size(), "{} has {} state fields", name_, field_names_.size());
    return Traits::get_field(typed(state), index);
  }
  void set_field(optim::OptimizerParamState& state, size_t index, at::Tensor value) const override {
    GPURUN_CHECK(index < field_names_.size(), "{} has {} state fields", name_, field_names_.size());
    Traits::set_field(typed(state), index, std::move(value));
  }

 private:
  // The registry checks types before calling; a wrong type here is a gpurun bug.
  template <class T, class Base>
  T& checked_cast(Base& base) const {
    auto* p = dynamic_cast<T*>(&base);
    GPURUN_CHECK(p != nullptr, "{} adapter given a {}", name_, c10::demangle(typeid(base).name()));
    return *p;
  }
  const Options& typed(const optim::OptimizerOptions& o) const {
    return checked_cast<const Options>(o);
  }
  Options& typed(optim::OptimizerOptions& o) const { return checked_cast<Options>(o); }
  const ParamState& typed(const optim::OptimizerParamState& s) const {
    return checked_cast<const ParamState>(s);
  }
  ParamState& typed(optim::OptimizerParamState& s) const { return checked_cast<ParamState>(s); }

  std::string name_ = Traits::kName;
  std::vector<std::string> option_names_ = Traits::option_names();
  std::vector<std::string> field_names_ = Traits::field_names();
};

template <class... Traits>
std::unique_ptr<OptimizerAdapter> adapter_for(const optim::Optimizer& optimizer) {
  std::unique_ptr<OptimizerAdapter> result;
  // Exact type match: a subclass may keep extra state gpurun would not move.
  ((typeid(optimizer) == typeid(typename Traits::Optimizer) && !result
        ? (result = std::make_unique<TypedAdapter<Traits>>(), 0)
        : 0),
   ...);
  return result;
}

}  // namespace
}  // namespace detail

std::unique_ptr<OptimizerAdapter> OptimizerAdapter::for_optimizer(
    const torch::optim::Optimizer& optimizer) {
  auto adapter = detail::adapter_for<detail::AdamTraits, detail::AdamWTraits, detail::SgdTraits,
                                     detail::RmspropTraits, detail::AdagradTraits>(optimizer);
  if (!adapter) {
    throw StateError(fmt::format(
        "gpurun cannot move the state of an optimizer of type {}: supported are exactly "
        "torch::optim::Adam, AdamW, SGD, RMSprop and Adagrad (not subclasses)",
        c10::demangle(typeid(optimizer).name())));
  }
  return adapter;
}

}  // namespace gpurun::rt
