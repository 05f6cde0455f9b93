// StateRegistry's receive reserve: a warm joiner's optimizer state buffers, made and faulted in
// before its admission so that a handoff's receive writes into memory that is already there.
#include <algorithm>

#include "state/state_registry_impl.hpp"

namespace gpurun::rt {

at::Tensor StateRegistry::Impl::take_reserved(const std::vector<int64_t>& shape,
                                              at::ScalarType dtype, const at::Device& device) {
  const auto fits = [&](const at::Tensor& t) {
    return t.scalar_type() == dtype && t.device() == device && t.sizes() == c10::IntArrayRef(shape);
  };
  const auto it = std::find_if(receive_reserve.begin(), receive_reserve.end(), fits);
  if (it == receive_reserve.end())
    return at::empty(shape, at::TensorOptions().dtype(dtype).device(device));
  at::Tensor t = std::move(*it);
  receive_reserve.erase(it);
  return t;
}

int64_t StateRegistry::reserve_receive(const at::Device& device) {
  Impl& m = *impl_;
  if (!device.is_cpu() || m.released) return 0;
  torch::NoGradGuard no_grad;
  int64_t bytes = 0;
  for (const Impl::TrackedOptimizer& o : m.optimizers) {
    const OptimizerAdapter& a = *o.adapter;
    for (auto& group : o.optimizer->param_groups()) {
      const size_t want = a.fields_after_step(group.options());
      for (const at::Tensor& p : group.params()) {
        size_t have = 0;
        if (const auto* s = Impl::state_of(o, p); s != nullptr && a.owns(*s))
          for (size_t f = 0; f < a.field_names().size(); ++f) have += a.field(*s, f).defined();
        for (size_t k = have; k < want; ++k) {
          at::Tensor t =
              at::zeros(p.sizes(), at::TensorOptions().dtype(p.scalar_type()).device(device));
          bytes += static_cast<int64_t>(t.nbytes());
          m.receive_reserve.push_back(std::move(t));
        }
      }
    }
  }
  return bytes;
}

void StateRegistry::drop_receive_reserve() {
  impl_->receive_reserve.clear();
}

}  // namespace gpurun::rt
