#include "comm/nccl/communicator.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <fmt/ranges.h>
#include <nccl.h>

#include "gpurun/store/client_store.hpp"

namespace gpurun::rt {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Pause between two polls of a stream or of the communicator state.
constexpr auto kPollInterval = std::chrono::microseconds(100);

long long elapsed_ms(Clock::time_point since) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - since).count();
}

bool nccl_dtype(at::ScalarType t, ncclDataType_t& out) {
  switch (t) {
    case at::kFloat:
      out = ncclFloat32;
      return true;
    case at::kDouble:
      out = ncclFloat64;
      return true;
    case at::kHalf:
      out = ncclFloat16;
      return true;
    case at::kBFloat16:
      out = ncclBfloat16;
      return true;
    case at::kInt:
      out = ncclInt32;
      return true;
    case at::kLong:
      out = ncclInt64;
      return true;
    default:
      return false;
  }
}

class NcclCommunicator final : public Communicator {
 public:
  /// `store`: the rendezvous connection, kept to poll options.abort while synchronize() waits.
  NcclCommunicator(ncclComm_t comm, CommOptions options, std::unique_ptr<store::ClientStore> store)
      : comm_(comm), options_(std::move(options)), store_(std::move(store)) {}

  ~NcclCommunicator() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (comm_ == nullptr) return;
    const c10::cuda::CUDAGuard guard(options_.device.index());
    bool clean = failure_.empty();
    if (clean) {
      // Flush what was issued, then free; a peer that is gone turns this into an abort.
      ncclResult_t res = ncclCommFinalize(comm_);
      const auto deadline = Clock::now() + options_.timeout;
      while (res == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::sleep_for(kPollInterval);
        if (ncclCommGetAsyncError(comm_, &res) != ncclSuccess) res = ncclInternalError;
      }
      clean = res == ncclSuccess;
    }
    if (clean) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  CommBackend backend() const override { return CommBackend::kNccl; }
  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  at::Device device() const override { return options_.device; }

  void all_reduce_sum(at::Tensor& t) override {
    constexpr const char* kOp = "all_reduce_sum";
    check_tensor(kOp, t);
    ncclDataType_t dtype;
    if (!nccl_dtype(t.scalar_type(), dtype)) {
      throw Error(
          fmt::format("nccl {} (group '{}', rank {}): dtype {} is not supported "
                      "(float32, float64, float16, bfloat16, int32, int64)",
                      kOp, options_.prefix, options_.rank, c10::toString(t.scalar_type())));
    }
    if (t.numel() == 0) {
      ensure_usable(kOp);
      return;
    }
    launch(kOp, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), dtype,
                           ncclSum, comm, stream);
    });
  }

  void broadcast(at::Tensor& t, int root) override {
    constexpr const char* kOp = "broadcast";
    check_tensor(kOp, t);
    if (root < 0 || root >= options_.size) {
      throw Error(
          fmt::format("nccl {} (group '{}', rank {}): root {} is not a rank of the "
                      "group (size {})",
                      kOp, options_.prefix, options_.rank, root, options_.size));
    }
    if (t.nbytes() == 0) {
      ensure_usable(kOp);
      return;
    }
    launch(kOp, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, comm, stream);
    });
  }

  std::vector<int64_t> all_gather_int64(int64_t value) override {
    constexpr const char* kOp = "all_gather_int64";
    ensure_usable(kOp);
    const auto on_device = at::TensorOptions().dtype(at::kLong).device(options_.device);
    at::Tensor send = at::full({1}, value, on_device);
    at::Tensor recv = at::empty({options_.size}, on_device);
    launch(kOp, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllGather(send.data_ptr(), recv.data_ptr(), 1, ncclInt64, comm, stream);
    });
    synchronize();
    at::Tensor host = recv.to(at::kCPU);
    const int64_t* p = host.data_ptr<int64_t>();
    return std::vector<int64_t>(p, p + options_.size);
  }

  void barrier() override {
    constexpr const char* kOp = "barrier";
    ensure_usable(kOp);
    at::Tensor one = at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(options_.device));
    all_reduce_sum(one);
    synchronize();
  }

  void synchronize() override {
    constexpr const char* kOp = "synchronize";
    ensure_usable(kOp);
    std::vector<cudaStream_t> streams;
    {
      std::lock_guard<std::mutex> lock(mu_);
      streams.swap(pending_streams_);
    }
    const auto start = Clock::now();
    const auto deadline = start + options_.timeout;
    for (cudaStream_t stream : streams) {
      for (;;) {
        const cudaError_t q = cudaStreamQuery(stream);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) {
          fail(kOp,
               fmt::format("CUDA error on the collectives' stream: {}", cudaGetErrorString(q)));
        }
        check_async_error(kOp);
        if (Clock::now() >= deadline) {
          fail(kOp, fmt::format("collectives not complete after {} ms (timeout {} ms)",
                                elapsed_ms(start), options_.timeout.count()));
        }
        poll_abort(kOp);
        std::this_thread::sleep_for(kPollInterval);
      }
    }
    check_async_error(kOp);
  }

  void abort() noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    if (comm_ == nullptr) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  void check_tensor(const char* op, const at::Tensor& t) const {
    if (!t.defined()) {
      throw Error(fmt::format("nccl {} (group '{}', rank {}): the tensor is undefined", op,
                              options_.prefix, options_.rank));
    }
    if (t.device() != options_.device) {
      throw Error(
          fmt::format("nccl {} (group '{}', rank {}): the tensor is on {}, the "
                      "communicator on {}",
                      op, options_.prefix, options_.rank, t.device().str(), options_.device.str()));
    }
    if (!t.is_contiguous()) {
      throw Error(
          fmt::format("nccl {} (group '{}', rank {}): the tensor (sizes [{}]) is not "
                      "contiguous; pass t.contiguous() and copy the result back",
                      op, options_.prefix, options_.rank, fmt::join(t.sizes(), ", ")));
    }
  }

  std::string who() const {
    return fmt::format("group '{}' (rank {} of {}, {})", options_.prefix, options_.rank,
                       options_.size, options_.device.str());
  }

  void ensure_usable(const char* op) {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) {
      throw CommError(
          fmt::format("nccl {} in {}: the communicator was aborted; create a new "
                      "one",
                      op, who()));
    }
    if (!failure_.empty()) {
      throw CommError(
          fmt::format("nccl {} in {}: the communicator is unusable after an "
                      "earlier failure ({}); create a new one",
                      op, who(), failure_));
    }
  }

  // At most every options_.abort.poll: fail() when gpurun abandoned this generation.
  void poll_abort(const char* op) {
    if (options_.abort.empty() || !store_) return;
    const auto now = Clock::now();
    if (now - last_abort_poll_ < options_.abort.poll) return;
    last_abort_poll_ = now;
    try {
      options_.abort.throw_if_set(*store_, who());
    } catch (const CommError& e) {
      fail(op, e.what());
    } catch (const std::exception&) {
      // The store connection is only a side channel here: its failure is not the group's.
      store_.reset();
    }
  }

  // Aborts the communicator and throws CommError. Takes mu_.
  [[noreturn]] void fail(const char* op, const std::string& what) {
    std::string msg;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::string last;
      if (comm_ != nullptr) {
        const char* l = ncclGetLastError(comm_);
        if (l != nullptr && *l != '\0') last = fmt::format(" (NCCL: {})", l);
      }
      msg = fmt::format(
          "nccl {} failed in {}: {}{}. A peer died, was aborted or did not reach "
          "the collective in time; the communicator was aborted",
          op, who(), what, last);
      if (failure_.empty()) failure_ = msg;
      if (comm_ != nullptr) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
      }
    }
    throw CommError(msg);
  }

  // Throws (and aborts) when NCCL reported an asynchronous error.
  void check_async_error(const char* op) {
    ncclResult_t state = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (comm_ == nullptr) {
        if (aborted_) {
          throw CommError(fmt::format("nccl {} in {}: the communicator was aborted", op, who()));
        }
        return;
      }
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
    }
    if (state != ncclSuccess && state != ncclInProgress) {
      fail(op, fmt::format("asynchronous NCCL error: {}", ncclGetErrorString(state)));
    }
  }

  // Enqueues one NCCL call on the current stream of the device. In non-blocking mode the call
  // may return ncclInProgress: wait (up to the timeout) until NCCL accepted it, as required
  // before the next NCCL call on this communicator.
  template <class Call>
  void launch(const char* op, Call&& call) {
    ensure_usable(op);
    const c10::cuda::CUDAGuard guard(options_.device.index());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream(options_.device.index()).stream();
    ncclResult_t res;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (comm_ == nullptr) {
        throw CommError(fmt::format("nccl {} in {}: the communicator was aborted", op, who()));
      }
      res = call(comm_, stream);
      if (std::find(pending_streams_.begin(), pending_streams_.end(), stream) ==
          pending_streams_.end()) {
        pending_streams_.push_back(stream);
      }
    }
    const auto start = Clock::now();
    while (res == ncclInProgress) {
      if (Clock::now() - start >= options_.timeout) {
        fail(op,
             fmt::format("NCCL did not accept the call within {} ms", options_.timeout.count()));
      }
      std::this_thread::sleep_for(kPollInterval);
      std::lock_guard<std::mutex> lock(mu_);
      if (comm_ == nullptr) break;  // aborted meanwhile; reported below
      if (ncclCommGetAsyncError(comm_, &res) != ncclSuccess) res = ncclInternalError;
    }
    if (res != ncclSuccess && res != ncclInProgress) {
      fail(op, fmt::format("NCCL error: {}", ncclGetErrorString(res)));
    }
    ensure_usable(op);
  }

  std::mutex mu_;  // guards comm_, aborted_, failure_, pending_streams_
  ncclComm_t comm_;
  CommOptions options_;
  std::unique_ptr<store::ClientStore> store_;  // abort polling; null when lost
  Clock::time_point last_abort_poll_{};
  bool aborted_ = false;
  std::string failure_;
  std::vector<cudaStream_t> pending_streams_;  // streams used since the last synchronize()
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const CommOptions& options) {
  if (!options.device.is_cuda() || !options.device.has_index()) {
    throw Error(
        fmt::format("the NCCL communicator of group '{}' (rank {}) needs a CUDA device "
                    "with an index (cuda:<i>), not {}; use the Gloo backend for CPU",
                    options.prefix, options.rank, options.device.str()));
  }
  const auto start = Clock::now();
  const std::string where = fmt::format("group '{}' (rank {} of {}, {})", options.prefix,
                                        options.rank, options.size, options.device.str());
  const std::string id_key = options.prefix + "/nccl_id";

  store::ClientOptions store_options = options.store;
  store_options.timeout = options.timeout;
  std::unique_ptr<store::ClientStore> store;
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  try {
    store = std::make_unique<store::ClientStore>(store_options);
    if (options.rank == 0) {
      const ncclResult_t res = ncclGetUniqueId(&id);
      if (res != ncclSuccess) {
        throw CommError(fmt::format("nccl rendezvous of {}: ncclGetUniqueId failed: {}", where,
                                    ncclGetErrorString(res)));
      }
      store->set(id_key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    } else {
      options.abort.wait(*store, {id_key}, options.timeout, where);
      const std::string bytes = store->get(id_key, options.timeout);
      if (bytes.size() != sizeof(id)) {
        throw CommError(
            fmt::format("nccl rendezvous of {}: the value at '{}' has {} bytes, "
                        "not the {} of an ncclUniqueId",
                        where, id_key, bytes.size(), sizeof(id)));
      }
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(fmt::format("nccl rendezvous of {} failed after {} ms (timeout {} ms){}: {}",
                                where, elapsed_ms(start), options.timeout.count(),
                                options.rank == 0 ? "" : " waiting for rank 0's ncclUniqueId",
                                e.what()));
  }
  auto drop_id_key = [&] {
    if (options.rank != 0) return;
    try {
      store->remove(id_key);
    } catch (...) {
    }
  };

  const c10::cuda::CUDAGuard guard(options.device.index());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t res = ncclCommInitRankConfig(&comm, options.size, id, options.rank, &config);
  std::string aborted;  // gpurun's reason when it abandoned the generation meanwhile
  auto last_poll = Clock::now();
  while (res == ncclInProgress) {
    if (Clock::now() - start >= options.timeout) break;
    std::this_thread::sleep_for(kPollInterval);
    if (ncclCommGetAsyncError(comm, &res) != ncclSuccess) res = ncclInternalError;
    if (res == ncclInProgress && Clock::now() - last_poll >= options.abort.poll) {
      last_poll = Clock::now();
      try {
        options.abort.throw_if_set(*store, where);
      } catch (const CommError& e) {
        aborted = e.what();
        break;
      } catch (const std::exception&) {  // a lost side channel: only the timeout is left
      }
    }
  }
  if (res != ncclSuccess) {
    std::string detail = !aborted.empty() ? aborted
                         : res == ncclInProgress
                             ? std::string("not every rank joined in time")
                             : fmt::format("NCCL error: {}", ncclGetErrorString(res));
    if (comm != nullptr) {
      const char* last = ncclGetLastError(comm);
      if (last != nullptr && *last != '\0') detail += fmt::format(" ({})", last);
      ncclCommAbort(comm);
    }
    drop_id_key();
    throw CommError(fmt::format("nccl rendezvous of {} failed after {} ms (timeout {} ms): {}",
                                where, elapsed_ms(start), options.timeout.count(), detail));
  }
  drop_id_key();
  return std::make_unique<NcclCommunicator>(comm, options, std::move(store));
}

}  // namespace gpurun::rt
