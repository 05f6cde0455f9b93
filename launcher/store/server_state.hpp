// gpurun::store::ServerState — what a Server's listener and sessions share:
// options, the memory budget, the backend, the reactors and the registry of
// open sessions. Internal to launcher/store (Server is the public facade).
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "store/backend.hpp"
#include "store/memory_budget.hpp"
#include "store/server.hpp"

namespace gpurun::store {

class Session;

/// Shared by the Server, its Listener and every Session (held by shared_ptr
/// from their handlers, so it outlives the last of them). Thread-safety per
/// member below.
class ServerState : public std::enable_shared_from_this<ServerState> {
 public:
  /// `reactors` = where sessions run; {&io} when single-threaded.
  ServerState(boost::asio::io_context& io, ServerOptions options,
              std::vector<boost::asio::io_context*> reactors);
  ServerState(const ServerState&) = delete;
  ServerState& operator=(const ServerState&) = delete;

  /// True when everything runs on the caller's io (ServerOptions::threads = 1).
  bool single_threaded() const { return reactors.size() == 1 && reactors[0] == &io; }
  /// Logs from any thread: at once on io's thread (single-threaded), else
  /// posted to io (dropped once ~Server has run).
  void log(std::string line);
  /// Logs on the calling thread (the constructing thread, before any reactor runs).
  void log_now(const std::string& line) const;
  /// Logs why a session was closed, from any thread: the first kMaxLoggedCloses are logged,
  /// then one line says that later ones are only counted (docs/errors.md: many problems of one
  /// kind are capped, not flooded; one bad client per connection could log without end).
  void log_close(std::string line);
  /// The "and K more" line when closes were left out; io's thread, once (~Server).
  void log_closes_left_out();
  static constexpr std::size_t kMaxLoggedCloses = 20;
  /// Runs f on `ctx`'s thread and blocks until it returns (inline when
  /// single-threaded or already on that thread).
  void run_on(boost::asio::io_context& ctx, const std::function<void()>& f);

  /// Adds an accepted session; false (not added) once close_sessions() ran.
  bool add_session(ConnectionId id, const std::shared_ptr<Session>& session);
  /// Any thread: removes a session from the registry.
  void forget_session(ConnectionId id);
  /// Any thread: the open session `id`, or nullptr.
  std::shared_ptr<Session> find_session(ConnectionId id);
  /// Number of registered sessions. Any thread.
  std::size_t num_sessions() const;
  /// Marks the server closed and closes every session on its own thread
  /// (blocks until each reactor has done so). Idempotent; io's thread.
  void close_sessions();
  /// Whether close_sessions() has run. Any thread.
  bool closed() const { return closed_.load(); }

  boost::asio::io_context& io;  // the caller's: logs run here; single-threaded: everything
  const ServerOptions options;
  MemoryBudget budget;  // before backend: the backend releases into it when destroyed
  Backend backend;
  // Where sessions run; reactors[0] also runs the acceptors. {&io} when single-threaded.
  const std::vector<boost::asio::io_context*> reactors;
  // Keeps io.run() from returning while the server is open; released by Server::close().
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> io_work;
  bool log_open = true;  // io's thread only; false once ~Server ran

 private:
  std::atomic<bool> closed_{false};            // written under sessions_mu_
  std::atomic<std::size_t> closes_logged_{0};  // log_close() calls so far
  // Taken after (never before) the backend's mutex.
  mutable std::mutex sessions_mu_;
  std::unordered_map<ConnectionId, std::weak_ptr<Session>> sessions_;
};

}  // namespace gpurun::store
