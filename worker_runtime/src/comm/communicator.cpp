// Backend names and the factory that picks the communicator compiled into this build.
#include "comm/communicator.hpp"

#include <fmt/format.h>

#if GPURUN_HAVE_GLOO
#include "comm/gloo/communicator.hpp"
#endif
#if GPURUN_HAVE_NCCL
#include "comm/nccl/communicator.hpp"
#endif

namespace gpurun::rt {
namespace {

/// A group of one: every collective is the identity, nothing to meet. NCCL's init alone costs
/// ~0.4 s on an H200 (comm in a one-GPU resume's breakdown), Gloo's a store round trip. Checks
/// its arguments as the backends do, so a program's mistake shows on one rank too.
class SoloCommunicator final : public Communicator {
 public:
  SoloCommunicator(CommBackend backend, const CommOptions& o)
      : backend_(backend), device_(o.device), prefix_(o.prefix) {
    const bool cpu = backend == CommBackend::kGloo;
    if (device_.is_cpu() != cpu)
      throw Error(fmt::format("{} communicator for group '{}': device {} (the {} backend needs {})",
                              to_string(backend), prefix_, device_.str(), to_string(backend),
                              cpu ? "the CPU" : "a CUDA device"));
  }
  CommBackend backend() const override { return backend_; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  at::Device device() const override { return device_; }
  void all_reduce_sum(at::Tensor& t) override {
    check("all_reduce_sum", t);
    if (!all_reduce_dtype_supported(t.scalar_type()))
      throw Error(
          fmt::format("{} all_reduce_sum (group '{}', rank 0): dtype {} is not supported (float32, "
                      "float64, float16, bfloat16, int32, int64)",
                      to_string(backend_), prefix_, c10::toString(t.scalar_type())));
  }
  void broadcast(at::Tensor& t, int root) override {
    check("broadcast", t);
    if (root != 0)
      throw Error(fmt::format("{} broadcast (group '{}' of one): root {} is not rank 0",
                              to_string(backend_), prefix_, root));
  }
  std::vector<int64_t> all_gather_int64(int64_t value) override {
    alive();
    return {value};
  }
  void barrier() override { alive(); }
  void synchronize() override { alive(); }
  void abort() noexcept override { aborted_ = true; }

 private:
  void alive() const {
    if (aborted_) throw CommError(fmt::format("communicator '{}' was aborted", prefix_));
  }
  void check(const char* op, const at::Tensor& t) const {
    const std::string what =
        fmt::format("{} {} (group '{}', rank 0)", to_string(backend_), op, prefix_);
    if (!t.defined()) throw Error(what + ": the tensor is undefined");
    if (t.device() != device_)
      throw Error(fmt::format("{}: the tensor is on {}, the communicator on {}", what,
                              t.device().str(), device_.str()));
    if (!t.is_contiguous()) throw Error(what + ": the tensor is not contiguous");
    alive();
  }
  CommBackend backend_;
  at::Device device_;
  std::string prefix_;
  bool aborted_ = false;
};

}  // namespace

const char* to_string(CommBackend b) {
  switch (b) {
    case CommBackend::kGloo:
      return "gloo";
    case CommBackend::kNccl:
      return "nccl";
  }
  return "unknown";
}

bool all_reduce_dtype_supported(at::ScalarType dtype) noexcept {
  switch (dtype) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kInt:
    case at::kLong:
      return true;
    default:
      return false;
  }
}

bool comm_backend_available(CommBackend b) {
  switch (b) {
    case CommBackend::kGloo:
      return GPURUN_HAVE_GLOO != 0;
    case CommBackend::kNccl:
      return GPURUN_HAVE_NCCL != 0;
  }
  return false;
}

std::unique_ptr<Communicator> make_communicator(CommBackend backend, const CommOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    throw Error(
        fmt::format("cannot create a {} communicator for group '{}': rank {} is not in "
                    "[0, {}) (size must be >= 1)",
                    to_string(backend), options.prefix, options.rank, options.size));
  }
  if (options.prefix.empty()) {
    throw Error(
        fmt::format("cannot create a {} communicator (rank {} of {}): the rendezvous "
                    "prefix is empty; give each group and generation its own prefix",
                    to_string(backend), options.rank, options.size));
  }
  if (options.size == 1 && comm_backend_available(backend))
    return std::make_unique<SoloCommunicator>(backend, options);
  switch (backend) {
    case CommBackend::kGloo:
#if GPURUN_HAVE_GLOO
      return make_gloo_communicator(options);
#else
      throw Error(
          "the Gloo communicator is not built in: rebuild gpurun with Gloo (Debian: install "
          "libgloo-dev, then configure with -DGPURUN_WITH_GLOO=ON)");
#endif
    case CommBackend::kNccl:
#if GPURUN_HAVE_NCCL
      return make_nccl_communicator(options);
#else
      throw Error(
          "the NCCL communicator is not built in: rebuild gpurun against a CUDA LibTorch with "
          "-DGPURUN_WITH_CUDA=ON (needs the CUDA toolkit and NCCL)");
#endif
  }
  throw Error(fmt::format("unknown communicator backend {}", static_cast<int>(backend)));
}

}  // namespace gpurun::rt
