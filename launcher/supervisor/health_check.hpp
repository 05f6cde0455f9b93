// gpurun::supervisor::HealthCheckServer — torchrun's TORCHELASTIC_HEALTH_CHECK_PORT, made real:
// an HTTP/1.1 endpoint on 127.0.0.1:<port> that answers whether the job is alive. (torch 2.11's
// own HealthCheckServer is a stub that starts nothing; docs/cli.md#health-check.)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>

namespace gpurun::supervisor {

/// What one request is answered with: `alive` -> 200, else 503; `json` is the body (one JSON
/// object, no newline).
struct Health {
  bool alive = false;
  std::string json;
};

class HealthCheckServer {
 public:
  /// Listens on 127.0.0.1:`port` (0: a free port, see port()). Every GET (any path) is answered
  /// with `probe()`'s result, called on the io thread; anything that is not a GET gets 405, a
  /// request head over 8 KiB or not complete within 5 s is dropped. Throws gpurun::Error naming
  /// the port when it cannot listen.
  HealthCheckServer(boost::asio::io_context& io, uint16_t port, std::function<Health()> probe);
  ~HealthCheckServer();
  HealthCheckServer(const HealthCheckServer&) = delete;
  HealthCheckServer& operator=(const HealthCheckServer&) = delete;

  uint16_t port() const;
  void close();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

/// TORCHELASTIC_HEALTH_CHECK_PORT's value -> a port; throws UsageError naming the variable.
uint16_t health_check_port(const std::string& value);

}  // namespace gpurun::supervisor
