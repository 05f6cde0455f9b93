// gpurun::rt::GlooCommunicator — Communicator over Gloo's TCP transport, for CPU tensors; the
// device's address is chosen by gloo_listen_address (one node: 127.0.0.1).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace gloo {
class Context;
}  // namespace gloo

namespace gpurun::rt {

/// Where this rank's Gloo device listens (every peer dials it): exactly one of the two is set.
struct GlooListenAddress {
  std::string iface;     ///< an interface name (from GLOO_SOCKET_IFNAME)
  std::string hostname;  ///< a numeric address or host name
};
/// The rule of docs/worker-runtime.md#gloo-across-nodes: `gloo_socket_ifname` (torch's
/// GLOO_SOCKET_IFNAME; its first entry) when non-empty; 127.0.0.1 while `store_host` (the
/// master address, maybe "[v6]") is loopback; else this host's source address on the route
/// to `store_host` (a connected UDP socket; nothing is sent); else the host name. Blocks for
/// a name lookup of `store_host`; never throws.
GlooListenAddress gloo_listen_address(const std::string& store_host,
                                      const std::string& gloo_socket_ifname);

/// Rendezvous (see make_gloo_communicator), then blocking collectives on CPU tensors. A
/// broadcast of 16 MiB or more moves over GPURUN_GLOO_LANES TCP streams at once (default 2;
/// the first such broadcast connects the extra ones: a full mesh each, every rank in it).
/// Every collective blocks the calling thread until it completed on this rank or failed.
/// One thread at a time may run collectives; abort() may be called from any thread.
/// Any Gloo failure (I/O error, peer closed, timeout) throws CommError and closes this
/// rank's connections, so that peers blocked in the same collective fail promptly too.
class GlooCommunicator final : public Communicator {
 public:
  /// Takes a connected context (made by make_gloo_communicator).
  GlooCommunicator(std::shared_ptr<::gloo::Context> context, CommOptions options);
  ~GlooCommunicator() override;
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  CommBackend backend() const override { return CommBackend::kGloo; }
  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  at::Device device() const override { return at::kCPU; }

  void all_reduce_sum(at::Tensor& t) override;
  void broadcast(at::Tensor& t, int root) override;
  std::vector<int64_t> all_gather_int64(int64_t value) override;
  void barrier() override;
  void synchronize() override;
  void abort() noexcept override;

 private:
  // Runs one Gloo collective `fn` (given the next tag); converts Gloo errors to CommError.
  template <class Fn>
  void run(const char* op, Fn&& fn);
  void check_tensor(const char* op, const at::Tensor& t) const;
  void ensure_usable(const char* op) const;
  [[noreturn]] void fail(const char* op, const std::string& what);
  // Closes every lane's connections (any thread; never throws).
  void close_all() noexcept;

  // A broadcast of at least kLaneMinBytes is cut into one piece per lane, all moving at once:
  // lane 0 on context_, the others on contexts of their own (own sockets and transport
  // thread), made by the first such broadcast (every rank is in it) through the store under
  // "<prefix>/lane/<i>". One TCP stream is bound by one core's copy; NCCL opens several
  // sockets per peer for the same reason (NCCL_NSOCKS_PERTHREAD).
  void ensure_lanes();
  static constexpr size_t kLaneMinBytes = size_t{16} << 20;

  std::shared_ptr<::gloo::Context> context_;
  CommOptions options_;
  int lane_count_ = 1;                                   ///< GPURUN_GLOO_LANES (default 2), 1..8
  std::vector<std::shared_ptr<::gloo::Context>> lanes_;  ///< lanes 1.., guarded by mu_
  uint32_t next_tag_ = 0;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;  // guards failure_ and lanes_
  std::string failure_;    // first failure; non-empty = unusable
};

/// Rendezvous of one Gloo group through the store at options.store under options.prefix:
/// each rank sets "<prefix>/joined/<rank>" and its transport addresses, connects to every
/// peer (full mesh over 127.0.0.1), runs a barrier, then deletes the keys it set.
/// Blocks until all options.size ranks connected, or options.timeout passed: CommError
/// naming the prefix and the ranks that had not joined (the keys this rank set are deleted
/// on that path too). Throws gpurun::Error for a non-CPU device.
std::unique_ptr<Communicator> make_gloo_communicator(const CommOptions& options);

}  // namespace gpurun::rt
