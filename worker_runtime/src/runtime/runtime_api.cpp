// gpurun::Runtime's public methods (gpurun/runtime.hpp) and its epoch / step ranges, over
// Runtime::Impl (runtime_impl.hpp).
#include "runtime/runtime_impl.hpp"

namespace gpurun {

at::Device Runtime::device() const {
  impl_->ensure_device();
  return impl_->device;
}
int Runtime::rank() const {
  return impl_->rank;
}
int Runtime::world_size() const {
  return impl_->world;
}
int64_t Runtime::generation() const {
  return impl_->generation;
}
int Runtime::gpu_id() const {
  return impl_->slot;
}
bool Runtime::elastic() const {
  return impl_->control != nullptr;
}
WorkerState Runtime::state() const {
  return impl_->state;
}
bool Runtime::joining() const {
  return impl_->joining;
}
bool Runtime::left() const {
  return impl_->state == WorkerState::kExited;
}
bool Runtime::checkpoint_requested() const {
  return impl_->checkpoint_req;
}
bool Runtime::stop_requested() const {
  return impl_->stop_req;
}
std::vector<int> Runtime::active_gpus() const {
  return impl_->active;
}

void Runtime::track(torch::nn::Module& module, torch::optim::Optimizer& optimizer) {
  track(module);
  impl_->registry.track_optimizer(optimizer);
}

void Runtime::track(torch::nn::Module& module) {
  Impl& m = *impl_;
  if (m.tracked) throw Error("Runtime::track(): the state is already tracked (call it once)");
  m.registry.track_module(module);
  m.registry.track_scalar("gpurun.epoch", &m.epoch);
  m.registry.track_scalar("gpurun.step_in_epoch", &m.step_in_epoch);
  m.registry.track_scalar("gpurun.global_step", &m.global_step);
  m.registry.track_scalar("gpurun.sampler.epoch", &m.sampler_epoch);
  m.registry.track_scalar("gpurun.sampler.cursor", &m.sampler_cursor);
  std::vector<at::Tensor> params;  // those that take part in gradient averaging
  for (const at::Tensor& p : module.parameters())
    if (p.requires_grad()) params.push_back(p);
  m.grads = std::make_unique<rt::GradientSync>(std::move(params), m.opt.bucket_bytes);
  m.tracked = true;
}

void Runtime::track_scalar(const std::string& name, int64_t* value) {
  impl_->registry.track_scalar(name, value);
}
void Runtime::track_scalar(const std::string& name, double* value) {
  impl_->registry.track_scalar(name, value);
}
void Runtime::track_extension(const std::string& name, std::shared_ptr<StateExtension> extension) {
  impl_->registry.track_extension(name, std::move(extension));
}

ElasticSampler& Runtime::sampler(int64_t dataset_size, ElasticSamplerOptions options) {
  Impl& m = *impl_;
  if (m.sampler) throw Error("Runtime::sampler(): already created (call it once)");
  if (m.started) throw Error("Runtime::sampler(): call it before epochs()");
  m.sampler.emplace(dataset_size, options);
  return *m.sampler;
}

Runtime::EpochRange Runtime::epochs(int64_t max_epochs) {
  impl_->max_epochs = max_epochs;
  impl_->ensure_started();
  EpochRange r;
  r.rt = impl_.get();
  r.max_epochs = max_epochs;
  return r;
}

Runtime::StepRange Runtime::steps(int64_t micro_batch) {
  if (micro_batch < 1)
    throw Error(fmt::format("Runtime::steps(): micro_batch {} < 1", micro_batch));
  impl_->ensure_started();
  StepRange r;
  r.rt = impl_.get();
  r.micro_batch = micro_batch;
  return r;
}

std::vector<std::vector<int64_t>> Runtime::upcoming_micro_batches(int64_t micro_batch) const {
  const Impl& m = *impl_;
  if (micro_batch < 1)
    throw Error(fmt::format("Runtime::upcoming_micro_batches(): micro_batch {} < 1", micro_batch));
  if (!m.sampler) throw Error("Runtime::upcoming_micro_batches(): call Runtime::sampler() first");
  ElasticSampler s = *m.sampler;  // a copy: planning changes nothing
  if (s.epoch() != m.epoch) s.set_epoch(m.epoch);
  std::vector<std::vector<int64_t>> out;
  for (int64_t done = m.step_in_epoch;;) {
    std::optional<Impl::Window> w = m.next_window(s, micro_batch);
    if (!w) break;
    for (auto& mb : w->micro_batches) out.push_back(std::move(mb));
    s.advance(w->count);
    ++done;
    if (m.every_steps > 0 && done % m.every_steps == 0) break;
  }
  return out;
}

void Runtime::all_reduce_gradients() {
  Impl& m = *impl_;
  m.ensure_started();
  // After a hold-mode rejoin at another epoch the rest of the old epoch's body runs alone.
  if (!m.comm || m.world == 1 || m.jumped) return;
  // A peer that dies mid-step: the survivors go on; this step's gradient is averaged over them
  // (the failed rank's samples of this step are not trained on).
  m.run_collective([&] { m.grads->average(); });
}

std::vector<double> Runtime::all_reduce_sum(std::vector<double> values) {
  Impl& m = *impl_;
  m.ensure_started();
  if (!m.comm || values.empty() || m.jumped) return values;
  const std::vector<double> mine = values;
  // A peer that dies: the sum is over the survivors (docs/worker-runtime.md, Failures).
  const bool summed = m.run_collective([&] {
    values = mine;
    at::Tensor t = at::from_blob(values.data(), {static_cast<int64_t>(values.size())},
                                 at::TensorOptions().dtype(at::kDouble))
                       .to(m.device, /*non_blocking=*/false, /*copy=*/true);
    m.comm->all_reduce_sum(t);
    m.comm->synchronize();
    t = t.to(at::kCPU).contiguous();
    std::memcpy(values.data(), t.data_ptr<double>(), values.size() * sizeof(double));
  });
  return summed ? values : mine;
}

uint64_t Runtime::state_checksum() {
  if (left()) {
    if (impl_->left_checksum) return *impl_->left_checksum;
    throw rt::StateError(fmt::format(
        "state_checksum(): this rank left the job in generation {} and its tracked tensors are "
        "freed; only a rank that wrote the pause snapshot or handed the state on knows the "
        "checksum it left with (docs/worker-runtime.md: the code after the loop)",
        impl_->generation));
  }
  impl_->sync_out();
  return impl_->registry.checksum();
}

void Runtime::run(int64_t max_epochs, const std::function<void(int64_t)>& train_one_epoch) {
  for (int64_t e : epochs(max_epochs)) train_one_epoch(e);
}

// ---- ranges ----------------------------------------------------------------------------

Runtime::EpochRange::iterator Runtime::EpochRange::begin() {
  iterator it;
  it.rt = rt;
  return it;
}

int64_t Runtime::EpochRange::iterator::operator*() const {
  return rt->epoch;
}

Runtime::EpochRange::iterator& Runtime::EpochRange::iterator::operator++() {
  Impl& m = *rt;
  if (m.jumped) {  // already past a boundary (rejoined at another position)
    m.jumped = false;
    return *this;
  }
  const int64_t finished = m.epoch;
  ++m.epoch;
  m.step_in_epoch = 0;
  if (m.sampler) m.sampler->set_epoch(m.epoch);
  if (m.epoch < m.max_epochs) m.boundary(finished, 0);
  m.jumped = false;  // the position after this boundary is where the loop goes on
  return *this;
}

bool Runtime::EpochRange::iterator::operator==(std::default_sentinel_t) const {
  return rt->finishing || rt->epoch >= rt->max_epochs;
}

Runtime::StepRange::iterator Runtime::StepRange::begin() {
  rt->range_epoch = rt->epoch;
  rt->range_micro = micro_batch;
  rt->build_step();
  iterator it;
  it.rt = rt;
  return it;
}

const Step& Runtime::StepRange::iterator::operator*() const {
  GPURUN_CHECK(rt->step_valid, "dereferencing a finished StepRange");
  return rt->step;
}

Runtime::StepRange::iterator& Runtime::StepRange::iterator::operator++() {
  rt->next_step();
  return *this;
}

bool Runtime::StepRange::iterator::operator==(std::default_sentinel_t) const {
  return !rt->step_valid;
}

}  // namespace gpurun
