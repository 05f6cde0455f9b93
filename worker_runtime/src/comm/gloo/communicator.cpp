#include "comm/gloo/communicator.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <future>
#include <string>
#include <utility>

#include <fmt/ranges.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include "comm/gloo/store.hpp"
#include "gpurun/check.hpp"
#include "gpurun/store/client_store.hpp"

namespace gpurun::rt {

namespace {

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

using Clock = std::chrono::steady_clock;

// A Gloo context of `options`' rank and size on a transport device of its own (its listening
// socket and its thread), connected to every peer through `store`; every rank has read every
// address when it returns (a barrier). Throws what Gloo and the store throw.
std::shared_ptr<::gloo::Context> connect_mesh(const CommOptions& options,
                                              ::gloo::rendezvous::Store& store) {
  auto context = std::make_shared<::gloo::rendezvous::Context>(options.rank, options.size);
  context->setTimeout(options.timeout);
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  const GlooListenAddress where = gloo_listen_address(options.store.host, ifname ? ifname : "");
  ::gloo::transport::tcp::attr attr;
  attr.iface = where.iface;
  attr.hostname = where.hostname;
  auto device = ::gloo::transport::tcp::CreateDevice(attr);
  context->connectFullMesh(store, device);
  if (options.size > 1) {
    ::gloo::BarrierOptions opts(context);
    opts.setTag(0xFFFFFFFFu);
    opts.setTimeout(options.timeout);
    ::gloo::barrier(opts);
  }
  return context;
}

// GPURUN_GLOO_LANES: how many TCP streams a large broadcast uses (GlooCommunicator::broadcast).
int lanes_from_env() {
  const char* v = std::getenv("GPURUN_GLOO_LANES");
  if (v == nullptr || *v == '\0') return 2;
  int n = 0;
  const char* end = v + std::strlen(v);
  const auto [ptr, ec] = std::from_chars(v, end, n);
  if (ec != std::errc() || ptr != end || n < 1 || n > 8)
    throw Error(
        fmt::format("GPURUN_GLOO_LANES='{}': expected a whole number from 1 to 8 (TCP "
                    "streams per large broadcast; default 2)",
                    v));
  return n;
}

std::string describe_current_exception() {
  try {
    throw;
  } catch (const ::gloo::Exception& e) {  // IoException, InvalidOperationException
    return e.what();
  } catch (const ::gloo::EnforceNotMet& e) {
    return e.what();
  } catch (const std::exception& e) {  // StoreError/StoreTimeout from the rendezvous
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

template <class T>
void gloo_all_reduce_sum(const std::shared_ptr<::gloo::Context>& ctx, void* data, size_t n,
                         uint32_t tag, std::chrono::milliseconds timeout) {
  ::gloo::AllreduceOptions opts(ctx);
  opts.setOutput<T>(static_cast<T*>(data), n);
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&::gloo::sum<T>));
  opts.setTag(tag);
  opts.setTimeout(timeout);
  ::gloo::allreduce(opts);
}

long long elapsed_ms(Clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count();
}

}  // namespace

GlooListenAddress gloo_listen_address(const std::string& store_host,
                                      const std::string& gloo_socket_ifname) {
  GlooListenAddress attr;
  if (!gloo_socket_ifname.empty()) {
    attr.iface = gloo_socket_ifname.substr(0, gloo_socket_ifname.find(','));
    return attr;
  }
  std::string host = store_host;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty() || is_loopback_host(host)) {
    attr.hostname = "127.0.0.1";
    return attr;
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) == 0 && res) {
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
      const int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      sockaddr_storage local{};
      socklen_t len = sizeof local;
      char text[INET6_ADDRSTRLEN] = {};
      bool ok = ::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
                ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
      if (ok && local.ss_family == AF_INET)
        ok = ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&local)->sin_addr, text,
                         sizeof text) != nullptr;
      else if (ok && local.ss_family == AF_INET6)
        ok = ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr, text,
                         sizeof text) != nullptr;
      else
        ok = false;
      ::close(fd);
      if (ok) {
        ::freeaddrinfo(res);
        attr.hostname = text;
        return attr;
      }
    }
    ::freeaddrinfo(res);
  }
  char name[256] = {};
  attr.hostname = ::gethostname(name, sizeof name - 1) == 0 ? name : "127.0.0.1";
  return attr;
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<::gloo::Context> context, CommOptions options)
    : context_(std::move(context)), options_(std::move(options)), lane_count_(lanes_from_env()) {}

GlooCommunicator::~GlooCommunicator() = default;

void GlooCommunicator::ensure_usable(const char* op) const {
  if (aborted_.load()) {
    throw CommError(
        fmt::format("gloo {} in group '{}' (rank {} of {}): the communicator was "
                    "aborted; create a new one",
                    op, options_.prefix, options_.rank, options_.size));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.empty()) {
    throw CommError(
        fmt::format("gloo {} in group '{}' (rank {} of {}): the communicator is "
                    "unusable after an earlier failure ({}); create a new one",
                    op, options_.prefix, options_.rank, options_.size, failure_));
  }
}

void GlooCommunicator::fail(const char* op, const std::string& what) {
  const std::string msg = fmt::format(
      "gloo {} failed in group '{}' (rank {} of {}, timeout {} ms): {}. A peer died, closed "
      "its connection, was aborted or did not reach the collective in time",
      op, options_.prefix, options_.rank, options_.size, options_.timeout.count(), what);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.empty()) failure_ = msg;
  }
  // Peers blocked in the same collective see the closed connections and fail now instead of
  // at their timeout.
  close_all();
  throw CommError(msg);
}

void GlooCommunicator::close_all() noexcept {
  std::vector<std::shared_ptr<::gloo::Context>> lanes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lanes = lanes_;
  }
  lanes.push_back(context_);
  for (const auto& c : lanes) {
    try {
      c->closeConnections();
    } catch (...) {
    }
  }
}

void GlooCommunicator::ensure_lanes() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!lanes_.empty() || lane_count_ <= 1) return;
  }
  std::vector<std::shared_ptr<::gloo::Context>> made;
  for (int i = 1; i < lane_count_; ++i) {
    store::ClientOptions store_options = options_.store;
    store_options.timeout = options_.timeout;
    GlooStore store(std::make_unique<store::ClientStore>(store_options),
                    fmt::format("{}/lane/{}", options_.prefix, i), store_options.timeout,
                    options_.abort);
    try {
      made.push_back(connect_mesh(options_, store));
    } catch (...) {
      store.delete_own_keys();
      throw;
    }
    store.delete_own_keys();
  }
  std::lock_guard<std::mutex> lock(mu_);
  lanes_ = std::move(made);
}

template <class Fn>
void GlooCommunicator::run(const char* op, Fn&& fn) {
  ensure_usable(op);
  const uint32_t tag = next_tag_++;
  try {
    fn(tag);
  } catch (...) {
    std::string what = describe_current_exception();
    if (aborted_.load()) what += " (the communicator was aborted during the call)";
    fail(op, what);
  }
}

void GlooCommunicator::check_tensor(const char* op, const at::Tensor& t) const {
  if (!t.defined()) {
    throw Error(fmt::format("gloo {} (group '{}', rank {}): the tensor is undefined", op,
                            options_.prefix, options_.rank));
  }
  if (!t.device().is_cpu()) {
    throw Error(
        fmt::format("gloo {} (group '{}', rank {}): the tensor is on {}; the Gloo "
                    "communicator takes CPU tensors only",
                    op, options_.prefix, options_.rank, t.device().str()));
  }
  if (!t.is_contiguous()) {
    throw Error(
        fmt::format("gloo {} (group '{}', rank {}): the tensor (sizes [{}]) is not "
                    "contiguous; pass t.contiguous() and copy the result back",
                    op, options_.prefix, options_.rank, fmt::join(t.sizes(), ", ")));
  }
}

void GlooCommunicator::all_reduce_sum(at::Tensor& t) {
  constexpr const char* kOp = "all_reduce_sum";
  check_tensor(kOp, t);
  const auto dtype = t.scalar_type();
  if (!all_reduce_dtype_supported(dtype)) {
    throw Error(
        fmt::format("gloo {} (group '{}', rank {}): dtype {} is not supported (float32, "
                    "float64, float16, bfloat16, int32, int64)",
                    kOp, options_.prefix, options_.rank, c10::toString(dtype)));
  }
  ensure_usable(kOp);
  if (t.numel() == 0) return;
  if (dtype == at::kBFloat16) {
    // Gloo has no bfloat16 arithmetic: sum in float32 (exact for the bf16 inputs), round once.
    at::Tensor tmp = t.to(at::kFloat);
    all_reduce_sum(tmp);
    t.copy_(tmp);
    return;
  }
  void* data = t.data_ptr();
  const size_t n = static_cast<size_t>(t.numel());
  const auto timeout = options_.timeout;
  run(kOp, [&](uint32_t tag) {
    switch (dtype) {
      case at::kFloat:
        gloo_all_reduce_sum<float>(context_, data, n, tag, timeout);
        break;
      case at::kDouble:
        gloo_all_reduce_sum<double>(context_, data, n, tag, timeout);
        break;
      case at::kHalf:  // at::Half and gloo::float16 are both one IEEE binary16 in 2 bytes
        static_assert(sizeof(at::Half) == sizeof(::gloo::float16));
        gloo_all_reduce_sum<::gloo::float16>(context_, data, n, tag, timeout);
        break;
      case at::kInt:
        gloo_all_reduce_sum<int32_t>(context_, data, n, tag, timeout);
        break;
      case at::kLong:
        gloo_all_reduce_sum<int64_t>(context_, data, n, tag, timeout);
        break;
      default:
        GPURUN_CHECK(false, "dtype {} passed the check above", c10::toString(dtype));
    }
  });
}

void GlooCommunicator::broadcast(at::Tensor& t, int root) {
  constexpr const char* kOp = "broadcast";
  check_tensor(kOp, t);
  if (root < 0 || root >= options_.size) {
    throw Error(
        fmt::format("gloo {} (group '{}', rank {}): root {} is not a rank of the group "
                    "(size {})",
                    kOp, options_.prefix, options_.rank, root, options_.size));
  }
  ensure_usable(kOp);
  if (t.nbytes() == 0 || options_.size == 1) return;
  auto* bytes = static_cast<uint8_t*>(t.data_ptr());
  const size_t n = t.nbytes();
  run(kOp, [&](uint32_t tag) {
    const auto one = [&](const std::shared_ptr<::gloo::Context>& c, uint8_t* at, size_t len) {
      ::gloo::BroadcastOptions opts(c);
      opts.setOutput<uint8_t>(at, len);
      opts.setRoot(root);
      opts.setTag(tag);
      opts.setTimeout(options_.timeout);
      ::gloo::broadcast(opts);
    };
    if (n < kLaneMinBytes || lane_count_ <= 1) {
      one(context_, bytes, n);
      return;
    }
    ensure_lanes();
    std::vector<std::shared_ptr<::gloo::Context>> contexts{context_};
    {
      std::lock_guard<std::mutex> lock(mu_);
      contexts.insert(contexts.end(), lanes_.begin(), lanes_.end());
    }
    // Equal pieces on 4 KiB boundaries, one per lane; lane 0 on this thread.
    const size_t piece = (n / contexts.size() + 4095) & ~size_t{4095};
    std::vector<std::future<void>> others;
    for (size_t i = 1; i < contexts.size() && i * piece < n; ++i)
      others.push_back(std::async(std::launch::async, one, contexts[i], bytes + i * piece,
                                  std::min(piece, n - i * piece)));
    std::exception_ptr first;
    try {
      one(context_, bytes, std::min(piece, n));
    } catch (...) {
      first = std::current_exception();
      close_all();  // the other lanes' pieces fail now instead of at their timeout
    }
    for (auto& f : others) {
      try {
        f.get();
      } catch (...) {
        if (!first) {
          first = std::current_exception();
          close_all();
        }
      }
    }
    if (first) std::rethrow_exception(first);
  });
}

std::vector<int64_t> GlooCommunicator::all_gather_int64(int64_t value) {
  constexpr const char* kOp = "all_gather_int64";
  std::vector<int64_t> out(static_cast<size_t>(options_.size), 0);
  ensure_usable(kOp);
  if (options_.size == 1) {
    out[0] = value;
    return out;
  }
  run(kOp, [&](uint32_t tag) {
    ::gloo::AllgatherOptions opts(context_);
    opts.setInput<int64_t>(&value, 1);
    opts.setOutput<int64_t>(out.data(), out.size());
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    ::gloo::allgather(opts);
  });
  return out;
}

void GlooCommunicator::barrier() {
  constexpr const char* kOp = "barrier";
  ensure_usable(kOp);
  if (options_.size == 1) return;
  run(kOp, [&](uint32_t tag) {
    ::gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    ::gloo::barrier(opts);
  });
}

void GlooCommunicator::synchronize() {
  ensure_usable("synchronize");
}

void GlooCommunicator::abort() noexcept {
  if (aborted_.exchange(true)) return;
  // Hard-closes every pair of every lane (peers see a reset); the contexts themselves are freed
  // by the destructor, which another thread's collective cannot race with.
  close_all();
}

std::unique_ptr<Communicator> make_gloo_communicator(const CommOptions& options) {
  if (!options.device.is_cpu()) {
    throw Error(
        fmt::format("the Gloo communicator of group '{}' (rank {}) takes CPU tensors, "
                    "not {}; use the NCCL backend for CUDA devices",
                    options.prefix, options.rank, options.device.str()));
  }
  const auto start = Clock::now();
  const std::string joined_key = fmt::format("joined/{}", options.rank);

  store::ClientOptions store_options = options.store;
  store_options.timeout = options.timeout;
  std::unique_ptr<GlooStore> store;
  try {
    store = std::make_unique<GlooStore>(std::make_unique<store::ClientStore>(store_options),
                                        options.prefix, store_options.timeout, options.abort);
  } catch (const std::exception& e) {
    throw CommError(
        fmt::format("gloo rendezvous of group '{}' (rank {} of {}): cannot reach "
                    "the store: {}",
                    options.prefix, options.rank, options.size, e.what()));
  }

  // Arrival first: each rank announces itself and waits for every other one, so that a
  // timeout names exactly the ranks this rank never saw.
  const auto deadline = start + options.timeout;
  std::vector<int> missing;
  int waiting_for = -1;  // the rank whose arrival this rank was waiting for, -1 after arrival
  auto rendezvous_error = [&](const std::string& what) {
    store->delete_own_keys();
    std::string who;
    if (!missing.empty())
      who = fmt::format("{} of {} ranks arrived; missing ranks: {}",
                        options.size - static_cast<int>(missing.size()), options.size,
                        fmt::join(missing, ", "));
    else if (waiting_for >= 0)
      who = fmt::format("while waiting for rank {} to arrive", waiting_for);
    else
      who = fmt::format("all {} ranks had arrived; failed while connecting", options.size);
    return CommError(
        fmt::format("gloo rendezvous of group '{}' failed on rank {} of {} after "
                    "{} ms (timeout {} ms; {}): {}",
                    options.prefix, options.rank, options.size, elapsed_ms(start),
                    options.timeout.count(), who, what));
  };
  try {
    store->set(joined_key, std::vector<char>{'1'});
    for (int r = 0; r < options.size; ++r) {
      if (r == options.rank) continue;
      const std::string key = fmt::format("joined/{}", r);
      if (!missing.empty()) {  // past the deadline: only look
        if (!store->exists(key)) missing.push_back(r);
        continue;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      waiting_for = r;
      try {
        store->wait({key}, std::max(left, std::chrono::milliseconds(1)));
      } catch (const StoreTimeout&) {
        missing.push_back(r);
      }
    }
    waiting_for = -1;
  } catch (const std::exception& e) {
    throw rendezvous_error(e.what());
  }
  if (!missing.empty()) throw rendezvous_error("timed out waiting for the other ranks");

  std::shared_ptr<::gloo::Context> context;
  try {
    context = connect_mesh(options, *store);
  } catch (...) {
    throw rendezvous_error(describe_current_exception());
  }
  // Best effort: a key left behind costs a few bytes, not correctness.
  store->delete_own_keys();
  return std::make_unique<GlooCommunicator>(std::move(context), options);
}

}  // namespace gpurun::rt
