#include "supervisor/health_check.hpp"

#include <array>
#include <chrono>

#include <fmt/format.h>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>

#include "gpurun/error.hpp"

namespace gpurun::supervisor {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

/// What the server answers with: the probe and the pages (shared with its sessions, so a
/// session outlives a closed server).
struct Handlers {
  std::function<Health()> probe;
  std::map<std::string, std::function<Page()>> pages;
};

namespace {
constexpr std::size_t kMaxHead = 8 * 1024;
constexpr auto kRequestTimeout = std::chrono::seconds(5);

struct Session : std::enable_shared_from_this<Session> {
  Session(tcp::socket s, std::shared_ptr<const Handlers> handlers)
      : socket(std::move(s)),
        timer(socket.get_executor()),
        buffer(kMaxHead),
        handlers(std::move(handlers)) {}

  void start() {
    auto self = shared_from_this();
    timer.expires_after(kRequestTimeout);
    timer.async_wait([self](const boost::system::error_code& ec) {
      if (!ec) {
        boost::system::error_code ignored;
        self->socket.close(ignored);
      }
    });
    asio::async_read_until(socket, buffer, "\r\n\r\n",
                           [self](const boost::system::error_code& ec, std::size_t) {
                             self->timer.cancel();
                             if (!ec) self->answer();
                           });
  }

  void answer() {
    std::istream in(&buffer);
    std::string method, target;
    in >> method >> target;
    int status = 405;
    std::string type = "application/json";
    std::string body = R"({"error": "only GET is answered"})";
    if (method == "GET" || method == "HEAD") {
      const std::string path = target.substr(0, target.find('?'));
      if (auto page = handlers->pages.find(path); page != handlers->pages.end()) {
        Page p = page->second();
        status = 200;
        type = std::move(p.content_type);
        body = std::move(p.body);
      } else {
        const Health h = handlers->probe();
        status = h.alive ? 200 : 503;
        body = h.json + "\n";
      }
    }
    reply = fmt::format(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n"
        "Connection: close\r\nCache-Control: no-store\r\n\r\n{}",
        status,
        status == 200   ? "OK"
        : status == 503 ? "Service Unavailable"
                        : "Method Not Allowed",
        type, body.size(), method == "HEAD" ? std::string() : body);
    auto self = shared_from_this();
    asio::async_write(socket, asio::buffer(reply),
                      [self](const boost::system::error_code&, std::size_t) {
                        boost::system::error_code ignored;
                        self->socket.shutdown(tcp::socket::shutdown_both, ignored);
                        self->socket.close(ignored);
                      });
  }

  tcp::socket socket;
  asio::steady_timer timer;
  asio::streambuf buffer;
  std::shared_ptr<const Handlers> handlers;  // outlives a closed server
  std::string reply;
};
}  // namespace

struct HealthCheckServer::Impl : std::enable_shared_from_this<Impl> {
  Impl(asio::io_context& io, std::function<Health()> p)
      : acceptor(io), handlers(std::make_shared<Handlers>(Handlers{std::move(p), {}})) {}

  void accept() {
    auto self = shared_from_this();
    acceptor.async_accept([self](const boost::system::error_code& ec, tcp::socket s) {
      if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
      if (!ec) std::make_shared<Session>(std::move(s), self->handlers)->start();
      self->accept();
    });
  }

  tcp::acceptor acceptor;
  std::shared_ptr<Handlers> handlers;
};

HealthCheckServer::HealthCheckServer(asio::io_context& io, uint16_t port,
                                     std::function<Health()> probe, const std::string& address,
                                     std::string what)
    : impl_(std::make_shared<Impl>(io, std::move(probe))) {
  if (what.empty())
    what = fmt::format("the health check server (TORCHELASTIC_HEALTH_CHECK_PORT={})", port);
  boost::system::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(address, ec);
  if (ec) throw Error(fmt::format("{}: '{}' is not an IP address", what, address));
  const tcp::endpoint at(ip, port);
  impl_->acceptor.open(at.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(at, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    throw Error(fmt::format("{} cannot listen on {}:{}: {}", what,
                            ip.is_v6() ? "[" + address + "]" : address, port, ec.message()));
  impl_->accept();
}

void HealthCheckServer::add_page(const std::string& path, std::function<Page()> page) {
  impl_->handlers->pages[path] = std::move(page);
}

HealthCheckServer::~HealthCheckServer() {
  close();
}

uint16_t HealthCheckServer::port() const {
  boost::system::error_code ec;
  const auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

void HealthCheckServer::close() {
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
}

uint16_t health_check_port(const std::string& value) {
  std::size_t used = 0;
  long v = -1;
  try {
    v = std::stol(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (value.empty() || used != value.size() || v < 0 || v > 65535)
    throw UsageError(fmt::format(
        "invalid value '{}' for TORCHELASTIC_HEALTH_CHECK_PORT: expected a port number 0-65535",
        value));
  return static_cast<uint16_t>(v);
}

}  // namespace gpurun::supervisor
