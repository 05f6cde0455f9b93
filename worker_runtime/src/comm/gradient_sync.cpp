#include "comm/gradient_sync.hpp"

#include <map>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gpurun::rt {

GradientSync::GradientSync(std::vector<at::Tensor> params, GradientSyncOptions options)
    : params_(std::move(params)), options_(options) {
  if (options_.bucket_cap_bytes <= 0) {
    throw Error(fmt::format("gradient sync: bucket cap must be > 0 bytes, got {}",
                            options_.bucket_cap_bytes));
  }
  // Open bucket per (dtype, device), as an index into buckets_.
  std::map<std::pair<int, std::string>, size_t> open;
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    if (!p.defined()) {
      throw Error(fmt::format("gradient sync: parameter {} of {} is undefined", k, params_.size()));
    }
    const auto key = std::make_pair(static_cast<int>(p.scalar_type()), p.device().str());
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    auto it = open.find(key);
    if (it != open.end()) {
      const Bucket& b = buckets_[it->second];
      const int64_t used = b.numel * static_cast<int64_t>(p.element_size());
      if (used + bytes > options_.bucket_cap_bytes) {
        open.erase(it);
        it = open.end();
      }
    }
    if (it == open.end()) {
      buckets_.push_back(Bucket{p.scalar_type(), p.device(), {}, {}, 0, {}});
      it = open.emplace(key, buckets_.size() - 1).first;
    }
    Bucket& b = buckets_[it->second];
    b.params.push_back(k);
    b.offset.push_back(b.numel);
    b.numel += p.numel();
  }
}

GradientSync::GradientSync(std::vector<at::Tensor> params, int64_t bucket_cap_bytes)
    : GradientSync(std::move(params), GradientSyncOptions{bucket_cap_bytes}) {}

std::vector<std::vector<size_t>> GradientSync::bucket_layout() const {
  std::vector<std::vector<size_t>> out;
  out.reserve(buckets_.size());
  for (const auto& b : buckets_) out.push_back(b.params);
  return out;
}

int64_t GradientSync::buffer_bytes() const {
  int64_t total = 0;
  for (const auto& b : buckets_) {
    if (b.flat.defined()) total += static_cast<int64_t>(b.flat.nbytes());
  }
  return total;
}

void GradientSync::release() noexcept {
  for (auto& b : buckets_) b.flat = at::Tensor();
}

void GradientSync::average() {
  if (comm_ == nullptr) {
    throw Error("gradient sync: average() called without a communicator (set_communicator)");
  }
  // Check every gradient before any communication, so that a bad one fails the same way on
  // every rank that has it and never leaves peers waiting in a half-done sequence.
  for (size_t k = 0; k < params_.size(); ++k) {
    const at::Tensor& p = params_[k];
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    if (g.sizes() != p.sizes() || g.scalar_type() != p.scalar_type() || g.device() != p.device() ||
        g.is_sparse()) {
      throw Error(fmt::format(
          "gradient sync: parameter {} (sizes [{}], {}, {}) has a gradient of sizes [{}], {}, "
          "{}{}; gradients must be dense and match their parameter",
          k, fmt::join(p.sizes(), ", "), c10::toString(p.scalar_type()), p.device().str(),
          fmt::join(g.sizes(), ", "), c10::toString(g.scalar_type()), g.device().str(),
          g.is_sparse() ? " (sparse)" : ""));
    }
  }
  // 1. Pack and reduce every bucket. Gradients are not modified yet.
  for (auto& b : buckets_) {
    if (!b.flat.defined()) {
      b.flat = at::empty({b.numel}, at::TensorOptions().dtype(b.dtype).device(b.device));
    }
    for (size_t i = 0; i < b.params.size(); ++i) {
      const at::Tensor& p = params_[b.params[i]];
      at::Tensor slot = b.flat.narrow(0, b.offset[i], p.numel());
      const at::Tensor& g = p.grad();
      if (g.defined()) {
        slot.view(p.sizes()).copy_(g);
      } else {
        slot.zero_();
      }
    }
    comm_->all_reduce_sum(b.flat);
  }
  comm_->synchronize();
  // 2. Scale and unpack.
  const double inv_world = 1.0 / static_cast<double>(comm_->size());
  for (auto& b : buckets_) {
    b.flat.mul_(inv_world);
    for (size_t i = 0; i < b.params.size(); ++i) {
      at::Tensor& p = params_[b.params[i]];
      at::Tensor mean = b.flat.narrow(0, b.offset[i], p.numel()).view(p.sizes());
      at::Tensor& g = p.mutable_grad();
      if (g.defined()) {
        g.copy_(mean);
      } else {
        g = mean.clone();
      }
    }
  }
}

}  // namespace gpurun::rt
