// gpurun::control::SeverWatch — a worker's side of keys::sever (docs/control-protocol.md#severed-
// addresses): node 0 gave up a node whose link was cut (no heartbeat for --node-timeout); a
// collective blocked on that node's workers would wait for GPURUN_COMM_TIMEOUT_MS, since a cut
// link delivers no reset. Node 0 names the lost node's address; this watch, off the main thread,
// shuts down (shutdown(2), SHUT_RDWR) this process's TCP connections to it, which fails the
// blocked Gloo collective at once: the runtimes then take the path of a peer's death. One per
// worker process (WorkerSession::from_env starts it); its own store connection.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "gpurun/store/store.hpp"

namespace gpurun::control {

/// Shuts down (SHUT_RDWR, the fd stays open) every TCP socket of this process whose remote
/// address is `address` (IPv4, IPv6, or IPv4 as ::ffff:a.b.c.d): /proc/self/fd's socket inodes
/// matched with /proc/self/net/tcp and tcp6. Listening sockets are left alone. Returns how many
/// it shut down; 0 for an address inet_pton does not read.
int sever_connections(const std::string& address);

/// Whether `address` is one of this host's (getifaddrs; loopback included).
bool local_address(const std::string& address);

/// Whether `address` is one of those `host` resolves to (getaddrinfo; blocks on a name lookup).
bool same_address(const std::string& address, const std::string& host);

struct SeverWatchOptions {
  /// The generation this worker is in; -1 while it has none (entries wait until it has one).
  std::function<int64_t()> generation;
  /// One line for the worker's log (any thread: the watch's).
  std::function<void(const std::string&)> log;
  /// The store's host (GPURUN_STORE_ADDR: a name or an address): the addresses it resolves to
  /// are never severed, whatever node 0 writes (the store connection stays). "" = none.
  std::string store_host;
  /// How often keys::sever(n) is looked for.
  std::chrono::milliseconds poll{250};
  /// The two OS calls (tests replace them).
  std::function<int(const std::string&)> sever = sever_connections;
  std::function<bool(const std::string&)> local = local_address;
};

/// Reads keys::sever(0), (1), … on `store` from its own thread; for each entry of this worker's
/// generation or a later one whose address is not this host's, calls sever(address) and logs
/// what it did. Stops, silently, when the store fails (the worker's own session reports that),
/// or when node 0 runs no elastic job over several nodes (no keys::node_job()).
class SeverWatch {
 public:
  SeverWatch(std::unique_ptr<store::Store> store, SeverWatchOptions options);
  /// Stops the thread (at once, or after the request in flight) and joins it.
  ~SeverWatch();
  SeverWatch(const SeverWatch&) = delete;
  SeverWatch& operator=(const SeverWatch&) = delete;

  /// Entries handled so far (tests).
  int64_t handled() const { return next_.load(); }

 private:
  void run();
  /// Sleeps `d` unless stopped; false once stopped.
  bool pause(std::chrono::milliseconds d);

  std::unique_ptr<store::Store> store_;
  SeverWatchOptions opt_;
  std::atomic<int64_t> next_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace gpurun::control
