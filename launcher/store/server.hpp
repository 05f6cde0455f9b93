// gpurun::store::Server — TCPStore-compatible server (torch >= 2.3 clients) on
// a single-threaded Boost.Asio io_context. Protocol and limits:
// docs/store-protocol.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "store/backend.hpp"
#include "store/frame_codec.hpp"

namespace gpurun::store {

/// Where and how the server listens.
struct ServerOptions {
  /// Addresses to listen on, all on the same port. The first address picks the
  /// port (see `port`); later ones reuse it. Default: loopback for a single
  /// node, IPv4 and IPv6 (clients resolving "localhost" may try either). An
  /// address other than the first that the host lacks (e.g. no IPv6: "::1")
  /// is skipped with a log line. "::" = every interface, dual-stack
  /// (v6only off), falling back to "0.0.0.0" when IPv6 is unavailable.
  std::vector<std::string> hosts{"127.0.0.1", "::1"};
  /// TCP port; 0 = let the kernel choose (read it back with Server::port()).
  uint16_t port = 0;
  /// listen() backlog; the kernel caps it at net.core.somaxconn. Large so
  /// that thousands of workers connecting at once are not refused.
  int backlog = 8192;
  /// Request size limits (defaults = torch's libuv server).
  Limits limits{};
  /// Receives one line per notable event (session closed for a bad frame,
  /// skipped listen address, accept failure). Runs on io's thread. Empty = silent.
  std::function<void(const std::string&)> log;
};

/// Listener plus one session per client connection, Beast-style: each session
/// reads, decodes and answers requests in order through a single-writer
/// queue; a malformed request closes only that session (logged with the peer
/// endpoint and the reason). All handlers run on the io_context's thread;
/// the io_context must be run by exactly one thread.
class Server {
 public:
  /// Binds and starts accepting on `io` immediately (handlers run on io's thread).
  /// Throws gpurun::StoreError naming host and port (e.g. "cannot listen on
  /// 127.0.0.1:29500: Address already in use") on failure.
  Server(boost::asio::io_context& io, ServerOptions options);
  /// Closes listeners and sessions (same as close()).
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// The bound port (useful with port 0).
  uint16_t port() const;
  /// Stops accepting and closes every session; idempotent. Call on io's thread.
  void close();
  /// Drops every key and queue whose name does not start with `keep_prefix`
  /// (Backend::reset_keyspace). Call on io's thread.
  void reset_keyspace(std::string_view keep_prefix);
  /// Number of open client sessions. Call on io's thread.
  std::size_t num_sessions() const;
  /// The store state, for in-process access; io's thread only.
  Backend& backend();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace gpurun::store
