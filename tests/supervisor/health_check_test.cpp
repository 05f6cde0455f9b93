#include "supervisor/health_check.hpp"

#include <doctest/doctest.h>

#include <string>
#include <thread>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "gpurun/error.hpp"

namespace gpurun::supervisor {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

/// The whole reply to `request` from 127.0.0.1:`port` (the server closes after one).
std::string ask(uint16_t port, const std::string& request) {
  asio::io_context io;
  tcp::socket s(io);
  s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  asio::write(s, asio::buffer(request));
  std::string reply;
  boost::system::error_code ec;
  asio::read(s, asio::dynamic_buffer(reply), ec);
  return reply;
}

/// A server on a free port answering on its own io thread.
struct Served {
  asio::io_context io;
  HealthCheckServer server{io, 0, [] { return Health{true, R"({"alive": true})"}; }};
  std::thread thread;
  void run() {
    thread = std::thread([this] {
      auto guard = asio::make_work_guard(io);
      io.run();
    });
  }
  ~Served() {
    io.stop();
    if (thread.joinable()) thread.join();
  }
};

TEST_CASE("health check server: a page at its path (/metrics), the health answer elsewhere") {
  Served s;
  s.server.add_page("/metrics", [] {
    return Page{"text/plain; version=0.0.4; charset=utf-8", "gpurun_world_size 2\n"};
  });
  s.run();
  const std::string m = ask(s.server.port(), "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n");
  CHECK(m.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(m.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n") != std::string::npos);
  CHECK(m.find("\r\n\r\ngpurun_world_size 2\n") != std::string::npos);
  const std::string head = ask(s.server.port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  CHECK(head.find("Content-Length: 20\r\n") != std::string::npos);
  CHECK(head.substr(head.size() - 4) == "\r\n\r\n");  // no body
  const std::string h = ask(s.server.port(), "GET /health HTTP/1.1\r\n\r\n");
  CHECK(h.find("Content-Type: application/json\r\n") != std::string::npos);
  CHECK(h.find("\r\n\r\n{\"alive\": true}\n") != std::string::npos);
}

TEST_CASE("health check server: a busy port or a bad address is an error naming the server") {
  asio::io_context io;
  HealthCheckServer first(io, 0, [] { return Health{}; });
  const uint16_t port = first.port();
  const std::string what = "the metrics server (--metrics-port " + std::to_string(port) + ")";
  const std::string busy = what + " cannot listen on 127.0.0.1:" + std::to_string(port) + ": ";
  try {
    HealthCheckServer second(
        io, port, [] { return Health{}; }, "127.0.0.1", what);
    FAIL("a second server listens on the same port");
  } catch (const gpurun::Error& e) {
    CHECK(std::string(e.what()).rfind(busy, 0) == 0);
  }
  CHECK_THROWS_WITH_AS(HealthCheckServer(
                           io, 0, [] { return Health{}; }, "localhost", what),
                       (what + ": 'localhost' is not an IP address").c_str(), gpurun::Error);
}

}  // namespace
}  // namespace gpurun::supervisor
