// gpurun::store::Server — TCPStore-compatible server (torch >= 2.3 clients) on
// Boost.Asio: one reactor thread with its own io_context per core (up to 8),
// sessions spread round-robin over them, one thread-safe Backend shared by
// all, one MemoryBudget for everything clients make it hold. Protocol, limits
// and threading: docs/store-protocol.md. This is the facade; the parts:
// reactor_pool.hpp (threads), listener.hpp (acceptors), session.hpp (one
// connection), server_state.hpp (what they share), memory_budget.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "gpurun/store/frame_codec.hpp"
#include "store/backend.hpp"
#include "store/memory_budget.hpp"

namespace gpurun::store {

class ReactorPool;
class ServerState;
class Listener;

/// Default ServerOptions::threads: min(std::thread::hardware_concurrency(), 8),
/// at least 1.
std::size_t default_server_threads();

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
  /// When `port` (not 0) is taken on one of `hosts` (EADDRINUSE), listen on a
  /// port the kernel picks instead of throwing: Server::port() differs from
  /// `port` then. For a single-node job given no port (docs/cli.md#ports).
  bool free_port_if_busy = false;
  /// listen() backlog; the kernel caps it at net.core.somaxconn. Large so
  /// that thousands of workers connecting at once are not refused.
  int backlog = 8192;
  /// Request size limits (defaults = torch's libuv server).
  Limits limits{};
  /// Bytes the store may hold for its clients in total, over every
  /// connection: keys and values in the backend (with a per-entry estimate of
  /// the containers' overhead), pending waits' key lists, requests being
  /// received, replies not yet written, read buffers. A request that would
  /// pass it is refused: the server closes that connection (only that one),
  /// logging the peer, the request and the budget. Items over 64 KiB may use
  /// only 7/8 of it, so short requests (health probes, rendezvous keys) are
  /// still served when bulk data has filled it. gpurun's own in-process writes
  /// (Server::backend()) are never refused. Default
  /// default_memory_budget_bytes() = min(RAM / 8, 4 GiB), at least 256 MiB;
  /// 0 = unlimited. Below 16 MiB the constructor throws gpurun::UsageError (a
  /// budget must admit a maximal 8 MiB value while it is received and stored).
  std::size_t memory_budget_bytes = default_memory_budget_bytes();
  /// Reactor threads serving the connections. 1 = no thread of its own:
  /// everything (accept, every session) runs on the io_context passed to the
  /// constructor, which must then be run by exactly one thread. N >= 2 = the
  /// server starts N threads, each running its own io_context; the acceptor
  /// hands new connections to them round-robin, and a session stays on its
  /// thread for its whole life. 0 = default_server_threads().
  std::size_t threads = default_server_threads();
  /// Receives one line per notable event (session closed for a bad frame,
  /// skipped listen address, accept failure). Runs on io's thread (with
  /// threads >= 2 the line is posted there, so io must be run to see it; lines
  /// still queued when the Server is destroyed are dropped). Empty = silent.
  std::function<void(const std::string&)> log;
};

/// Listener plus one session per client connection, Beast-style: each session
/// reads, decodes and answers requests in order through a single-writer
/// queue; a malformed request closes only that session (logged with the peer
/// endpoint and the reason).
///
/// Threading: each session runs on one reactor thread (see
/// ServerOptions::threads); its replies are written in request order. The
/// Backend is shared and locked per operation. A WAIT released by a write on
/// another thread gets its STOP_WAITING queued on the waiter's session while
/// the backend is still locked, then written by the waiter's thread, so no
/// wake-up is lost and a CANCEL_WAIT's 1 never precedes a crossed 0.
/// Construct, close() and destroy the Server on io's thread (the thread that
/// runs io, or any one thread while io is not running); the other members are
/// thread-safe.
class Server {
 public:
  /// Binds and starts accepting immediately (on io, or on the first reactor
  /// thread when options.threads >= 2), then starts the reactor threads.
  /// Keeps io from running out of work until close(), as the acceptor on io
  /// did when the server was single-threaded. Throws gpurun::StoreError naming host and port (e.g.
  /// "cannot listen on 127.0.0.1:29500: Address already in use") on failure,
  /// gpurun::UsageError for a memory_budget_bytes under 16 MiB (other than 0).
  Server(boost::asio::io_context& io, ServerOptions options);
  /// Closes listeners and sessions (same as close()), then stops and joins
  /// the reactor threads.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// The bound port (useful with port 0).
  uint16_t port() const;
  /// Number of reactor threads (ServerOptions::threads, 0 resolved).
  std::size_t threads() const;
  /// Stops accepting and closes every session; idempotent. Blocks until every
  /// reactor thread has closed its sessions (they stay running until the
  /// destructor). Call on io's thread.
  void close();
  /// Drops every key and queue whose name does not start with `keep_prefix`
  /// (Backend::reset_keyspace). Thread-safe.
  void reset_keyspace(std::string_view keep_prefix);
  /// Number of open client sessions. Thread-safe; a session closed on a
  /// reactor thread leaves the count shortly after its socket closes.
  std::size_t num_sessions() const;
  /// The store state, for in-process access. Thread-safe (Backend locks every
  /// operation); valid while the Server lives. Writes through it use
  /// Admit::kAlways: charged to the memory budget, never refused.
  Backend& backend();
  /// The memory budget (ServerOptions::memory_budget_bytes) and what is
  /// charged to it now. Thread-safe; valid while the Server lives.
  const MemoryBudget& memory_budget() const;

 private:
  std::unique_ptr<ReactorPool> reactors_;  // destroyed after state_ (see ~Server)
  std::shared_ptr<ServerState> state_;
  std::shared_ptr<Listener> listener_;
};

}  // namespace gpurun::store
