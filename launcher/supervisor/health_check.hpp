// gpurun::supervisor::HealthCheckServer — torchrun's TORCHELASTIC_HEALTH_CHECK_PORT, made real:
// an HTTP/1.1 endpoint on 127.0.0.1:<port> that answers whether the job is alive. (torch 2.11's
// own HealthCheckServer is a stub that starts nothing; docs/cli.md#health-check.)
#pragma once

#include <cstdint>
#include <functional>
#include <map>
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

/// A page served at a path of its own (GET `/metrics`): 200 with `body` as `content_type`.
struct Page {
  std::string content_type;
  std::string body;
};

class HealthCheckServer {
 public:
  /// Listens on `address`:`port` (0: a free port, see port()). A GET (or HEAD) of a path
  /// added with add_page() is answered with that page; every other path with `probe()`'s
  /// result; both are called on the io thread. Anything that is not a GET gets 405, a request
  /// head over 8 KiB or not complete within 5 s is dropped. Throws gpurun::Error naming the
  /// address and port (`what` says which server: "the health check server
  /// (TORCHELASTIC_HEALTH_CHECK_PORT=8080)") when it cannot listen.
  HealthCheckServer(boost::asio::io_context& io, uint16_t port, std::function<Health()> probe,
                    const std::string& address = "127.0.0.1", std::string what = {});
  /// Serves `page()` at `path` (e.g. "/metrics"; the query string is ignored) from now on.
  void add_page(const std::string& path, std::function<Page()> page);
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
