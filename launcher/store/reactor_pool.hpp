// gpurun::store::ReactorPool — the reactor threads of a Server with
// ServerOptions::threads >= 2: one io_context per thread. docs/store-protocol.md
// ("Threading").
#pragma once

#include <cstddef>
#include <memory>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

namespace gpurun::store {

/// N io_contexts, each run by its own thread and kept from running out of work
/// by a guard until stop(). Not thread-safe: construct, start, stop and
/// destroy it on one thread.
class ReactorPool {
 public:
  /// Creates `n` io_contexts (concurrency hint 1); no thread runs yet.
  explicit ReactorPool(std::size_t n);
  /// stop().
  ~ReactorPool();
  ReactorPool(const ReactorPool&) = delete;
  ReactorPool& operator=(const ReactorPool&) = delete;

  /// Starts one thread per io_context.
  void start();
  /// Stops every io_context and joins its thread (blocks until the handlers
  /// running now return); pending handlers stay queued until the contexts are
  /// destroyed. Idempotent.
  void stop();
  /// The io_contexts, valid while the pool lives.
  std::vector<boost::asio::io_context*> contexts() const;

 private:
  std::vector<std::unique_ptr<boost::asio::io_context>> contexts_;
  std::vector<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::vector<std::thread> threads_;
};

}  // namespace gpurun::store
