// TestServer and helpers for store-client tests (store, comm, gradient sync): a real
// gpurun::store::Server on its own io thread, a raw socket for hand-written frames, polling
// with a generous deadline.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include "gpurun/sanitizers.hpp"
#include "gpurun/store/client.hpp"
#include "poll.hpp"  // tests/common: poll_until
#include "store/server.hpp"

namespace gpurun::store::testing {

// Deadline used only to turn a hang into a failure, never to assert speed.
inline constexpr auto kHangGuard = std::chrono::seconds(20);

// This process's resident set size (VmRSS of /proc/self/status), in KiB; 0 when unreadable.
inline int64_t resident_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return 0;
}

/// `pred` holds within the hang guard (poll_until, every 2 ms).
inline bool eventually(const std::function<bool()>& pred) {
  return gpurun::testing::poll_until(pred, kHangGuard, std::chrono::milliseconds(2));
}

// A Server running on its own io thread.
class TestServer {
 public:
  explicit TestServer(ServerOptions options = {}) {
    options.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      logs_.push_back(line);
    };
    server_ = std::make_unique<Server>(io_, std::move(options));
    port_ = server_->port();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~TestServer() { destroy_server(); }
  /// Destroys the Server on its io thread (its last log lines are kept); idempotent.
  void destroy_server() {
    if (!thread_.joinable()) return;
    on_io([this] { server_.reset(); });
    io_.stop();
    thread_.join();
  }

  uint16_t port() const { return port_; }

  // Runs f on the io thread and returns its result.
  template <class F>
  auto on_io(F f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto fut = task.get_future();
    boost::asio::post(io_, [&task] { task(); });
    return fut.get();
  }

  Server& server() { return *server_; }

  bool log_contains(const std::string& needle) { return log_count(needle) > 0; }
  /// Log lines containing `needle`.
  std::size_t log_count(const std::string& needle) {
    std::lock_guard<std::mutex> lock(mu_);
    std::size_t n = 0;
    for (const auto& l : logs_) n += l.find(needle) != std::string::npos;
    return n;
  }

  ClientOptions client_options() const {
    ClientOptions o;
    o.host = "127.0.0.1";
    o.port = port_;
    o.timeout = kHangGuard;
    o.connect_backoff_initial = std::chrono::milliseconds(10);
    return o;
  }

 private:
  boost::asio::io_context io_;
  // Keeps io_.run() going after the server closes, so on_io() still works.
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{
      io_.get_executor()};
  std::unique_ptr<Server> server_;
  uint16_t port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> logs_;
};

// A blocking IPv4 socket for hand-written frames.
class RawConn {
 public:
  explicit RawConn(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    timeval tv{static_cast<time_t>(kHangGuard.count()), 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawConn() { close(); }
  bool connected() const { return connected_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void send(const std::string& bytes) { ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL); }
  // Reads n bytes; returns fewer if the peer closed or the hang guard fired.
  std::string read(std::size_t n) {
    std::string out(n, '\0');
    std::size_t got = 0;
    while (got < n) {
      const ssize_t r = ::recv(fd_, out.data() + got, n - got, 0);
      if (r <= 0) break;
      got += static_cast<std::size_t>(r);
    }
    out.resize(got);
    return out;
  }
  // True when the peer closed the connection (EOF or reset) before sending anything.
  bool closed_by_peer() {
    char c;
    const ssize_t r = ::recv(fd_, &c, 1, 0);
    return r == 0 || (r < 0 && errno == ECONNRESET);
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

inline std::string validate_frame() {
  std::string out;
  encode_request(Request{QueryType::kValidate, {}, {}, 0, kValidationMagic}, out);
  return out;
}

inline std::string frame(const Request& r) {
  std::string out;
  encode_request(r, out);
  return out;
}

}  // namespace gpurun::store::testing
