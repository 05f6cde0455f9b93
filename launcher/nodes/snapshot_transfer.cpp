#include "nodes/snapshot_transfer.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>

#include "gpurun/error.hpp"
#include "gpurun/unique_fd.hpp"
#include "supervisor/worker_env.hpp"

namespace gpurun::supervisor {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::string_view kMagic = "GPURUN-SNAPSHOT 1 ";
constexpr std::size_t kMaxRequest = 1024;
constexpr std::size_t kChunk = std::size_t{8} << 20;  // one sendfile / recv at most

std::string errno_text(int err) {
  return std::strerror(err);
}

}  // namespace

namespace transfer_detail {

struct Shared {
  SnapshotServerOptions opt;
  int connections = 0;
  void log(const std::string& line) const {
    if (opt.log) opt.log(line);
  }
};

struct Session : std::enable_shared_from_this<Session> {
  Session(tcp::socket s, std::shared_ptr<Shared> sh)
      : socket(std::move(s)), timer(socket.get_executor()), request(kMaxRequest), shared(sh) {
    ++shared->connections;
    boost::system::error_code ec;
    const auto ep = socket.remote_endpoint(ec);
    peer = ec ? std::string("?") : fmt::format("{}:{}", ep.address().to_string(), ep.port());
  }
  ~Session() { --shared->connections; }

  void start() {
    auto self = shared_from_this();
    arm(shared->opt.request_timeout, "sent no request");
    asio::async_read_until(
        socket, request, '\n', [self](const boost::system::error_code& ec, std::size_t n) {
          self->timer.cancel();
          if (ec) {
            if (ec != asio::error::operation_aborted)
              self->shared->log(
                  fmt::format("snapshot server: {}: no request: {}", self->peer,
                              ec == asio::error::not_found ? "over 1024 bytes" : ec.message()));
            self->close();
            return;
          }
          self->answer(n);
        });
  }

  /// Closes the connection unless `timer` is re-armed or cancelled within `after`.
  void arm(std::chrono::milliseconds after, const char* what) {
    auto self = shared_from_this();
    timer.expires_after(after);
    timer.async_wait([self, after, what](const boost::system::error_code& ec) {
      if (ec) return;
      self->shared->log(fmt::format("snapshot server: {} {} for {} ms: closing its connection",
                                    self->peer, what, after.count()));
      self->close();
    });
  }

  void answer(std::size_t n) {
    std::string line(asio::buffers_begin(request.data()),
                     asio::buffers_begin(request.data()) + static_cast<std::ptrdiff_t>(n) - 1);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind(kMagic, 0) != 0) return refuse("not a snapshot request");
    const std::string run_id = line.substr(kMagic.size());
    if (run_id != shared->opt.run_id)
      return refuse(fmt::format("this node serves job '{}', not '{}'", shared->opt.run_id, run_id));
    if (shared->connections > shared->opt.max_connections)
      return refuse(fmt::format("busy: {} transfers at once", shared->opt.max_connections));
    std::vector<std::string> files =
        shared->opt.files ? shared->opt.files() : std::vector<std::string>{};
    std::string tried;
    for (const std::string& f : files) {
      file = UniqueFd(::open(f.c_str(), O_RDONLY | O_CLOEXEC));
      if (file) {
        path = f;
        break;
      }
      tried += fmt::format("{}'{}': {}", tried.empty() ? "" : ", ", f, errno_text(errno));
    }
    if (!file)
      return refuse(
          fmt::format("this node has no pause snapshot ({})", tried.empty() ? "no path" : tried));
    struct stat st {};
    if (::fstat(file.get(), &st) != 0)
      return refuse(fmt::format("'{}': {}", path, errno_text(errno)));
    size = static_cast<int64_t>(st.st_size);
    reply = fmt::format("OK {}\n", size);
    auto self = shared_from_this();
    arm(shared->opt.stall_timeout, "read nothing");
    asio::async_write(socket, asio::buffer(reply),
                      [self](const boost::system::error_code& ec, std::size_t) {
                        if (ec) return self->failed(ec.message());
                        self->pump();
                      });
  }

  void refuse(const std::string& why) {
    shared->log(fmt::format("snapshot server: refused {}: {}", peer, why));
    reply = fmt::format("ERR {}\n", why);
    auto self = shared_from_this();
    arm(shared->opt.request_timeout, "read no answer");
    asio::async_write(socket, asio::buffer(reply),
                      [self](const boost::system::error_code&, std::size_t) { self->close(); });
  }

  /// sendfile until the socket is full (then wait until it drains) or the file is sent; yields
  /// to the io thread's other work after each chunk.
  void pump() {
    if (!socket.is_open()) return;
    boost::system::error_code ec;
    socket.native_non_blocking(true, ec);
    if (ec) return failed(ec.message());
    const int64_t left = size - offset;
    if (left <= 0) return finished();
    off_t at = static_cast<off_t>(offset);
    const ssize_t n = ::sendfile(socket.native_handle(), file.get(), &at,
                                 static_cast<std::size_t>(std::min<int64_t>(left, kChunk)));
    auto self = shared_from_this();
    if (n > 0) {
      offset += n;
      arm(shared->opt.stall_timeout, "read nothing");
      asio::post(socket.get_executor(), [self] { self->pump(); });
      return;
    }
    if (n == 0) return failed(fmt::format("'{}' ended at byte {} of {}", path, offset, size));
    if (errno == EAGAIN || errno == EINTR) {
      socket.async_wait(tcp::socket::wait_write, [self](const boost::system::error_code& e) {
        if (e) return self->failed(e.message());
        self->pump();
      });
      return;
    }
    failed(errno_text(errno));
  }

  void finished() {
    timer.cancel();
    boost::system::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_send, ignored);
    close();
  }

  void failed(const std::string& why) {
    if (socket.is_open())
      shared->log(fmt::format("snapshot server: sending '{}' to {} failed after {} of {} bytes: {}",
                              path, peer, offset, size, why));
    close();
  }

  void close() {
    timer.cancel();
    boost::system::error_code ignored;
    socket.close(ignored);
  }

  tcp::socket socket;
  asio::steady_timer timer;
  asio::streambuf request;
  std::shared_ptr<Shared> shared;
  std::string peer;
  std::string reply;
  std::string path;
  UniqueFd file;
  int64_t size = 0;
  int64_t offset = 0;
};

}  // namespace transfer_detail

namespace {

/// "host:port" / "[v6]:port" -> (host, port); throws gpurun::Error.
std::pair<std::string, std::string> split_endpoint(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon + 1 == endpoint.size() || colon == 0)
    throw Error(fmt::format("'{}' is not host:port", endpoint));
  std::string host = endpoint.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return {host, endpoint.substr(colon + 1)};
}

/// Waits until `fd` is ready for `events`; false after `timeout` without it. Throws on cancel.
bool wait_fd(int fd, short events, std::chrono::milliseconds timeout,
             const std::atomic<bool>* cancel) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (cancel && cancel->load()) throw Error("cancelled (this gpurun is ending)");
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 200)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) throw Error(fmt::format("poll: {}", errno_text(errno)));
  }
}

UniqueFd connect_to(const std::string& host, const std::string& port,
                    std::chrono::milliseconds timeout, const std::atomic<bool>* cancel) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int r = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); r != 0)
    throw Error(fmt::format("'{}' does not resolve: {}", host, ::gai_strerror(r)));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, &::freeaddrinfo);
  std::string errors;
  for (addrinfo* a = found; a; a = a->ai_next) {
    UniqueFd fd(
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd) continue;
    int err = 0;
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        if (!wait_fd(fd.get(), POLLOUT, timeout, cancel)) {
          err = ETIMEDOUT;
        } else {
          socklen_t len = sizeof err;
          ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        }
      }
    }
    if (err == 0) return fd;
    errors += fmt::format("{}{}", errors.empty() ? "" : "; ", errno_text(err));
  }
  throw Error(fmt::format("cannot connect: {}", errors.empty() ? "no address" : errors));
}

}  // namespace

using transfer_detail::Session;
using transfer_detail::Shared;

struct SnapshotServer::Impl : std::enable_shared_from_this<Impl> {
  Impl(asio::io_context& io, SnapshotServerOptions o)
      : acceptor(io), shared(std::make_shared<Shared>(Shared{std::move(o), 0})) {}

  void accept() {
    auto self = shared_from_this();
    acceptor.async_accept([self](const boost::system::error_code& ec, tcp::socket s) {
      if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
      if (!ec) std::make_shared<Session>(std::move(s), self->shared)->start();
      self->accept();
    });
  }

  tcp::acceptor acceptor;
  std::shared_ptr<Shared> shared;
};

SnapshotServer::SnapshotServer(asio::io_context& io, SnapshotServerOptions options)
    : impl_(std::make_shared<Impl>(io, std::move(options))) {
  const std::string& address = impl_->shared->opt.address;
  const uint16_t port = impl_->shared->opt.port;
  boost::system::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(address, ec);
  if (ec) throw Error(fmt::format("the snapshot server: '{}' is not an IP address", address));
  const tcp::endpoint at(ip, port);
  impl_->acceptor.open(at.protocol(), ec);
  if (!ec && ip.is_v6() && ip.is_unspecified())  // "::" takes IPv4 clients too
    impl_->acceptor.set_option(asio::ip::v6_only(false), ec);
  if (!ec) impl_->acceptor.bind(at, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    throw Error(fmt::format("the snapshot server cannot listen on {}:{}: {}",
                            ip.is_v6() ? "[" + address + "]" : address, port, ec.message()));
  impl_->accept();
}

SnapshotServer::~SnapshotServer() {
  close();
}

uint16_t SnapshotServer::port() const {
  boost::system::error_code ec;
  const auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

std::string SnapshotServer::endpoint(const std::string& host) const {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port())
                                             : fmt::format("{}:{}", host, port());
}

void SnapshotServer::set_run_id(std::string run_id) {
  impl_->shared->opt.run_id = std::move(run_id);
}

void SnapshotServer::close() {
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
}

SnapshotFetched fetch_snapshot(const std::string& endpoint, const std::string& run_id,
                               const std::string& dest, std::chrono::milliseconds timeout,
                               const std::atomic<bool>* cancel) {
  const auto t0 = Clock::now();
  const std::string tmp = fmt::format("{}.tmp.{}", dest, ::getpid());
  int64_t got = 0, size = -1;
  UniqueFd out;
  try {
    const std::pair<std::string, std::string> hp = split_endpoint(endpoint);
    UniqueFd sock = connect_to(hp.first, hp.second, timeout, cancel);
    const std::string req = fmt::format("{}{}\n", kMagic, run_id);
    for (std::size_t sent = 0; sent < req.size();) {
      const ssize_t n = ::send(sock.get(), req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        if (!wait_fd(sock.get(), POLLOUT, timeout, cancel))
          throw Error(fmt::format("no room to send the request for {} ms", timeout.count()));
      } else {
        throw Error(fmt::format("sending the request: {}", errno_text(errno)));
      }
    }
    std::vector<char> buf(kChunk);
    std::size_t have = 0;  // bytes in buf
    // The receive loop: returns the bytes read into buf + have (0: the peer closed).
    const auto receive = [&](std::size_t room) -> std::size_t {
      for (;;) {
        const ssize_t n = ::recv(sock.get(), buf.data() + have, room, 0);
        if (n >= 0) return static_cast<std::size_t>(n);
        if (errno != EAGAIN && errno != EINTR)
          throw Error(fmt::format("receiving: {}", errno_text(errno)));
        if (!wait_fd(sock.get(), POLLIN, timeout, cancel))
          throw Error(fmt::format("no byte came for {} ms", timeout.count()));
      }
    };
    std::size_t eol = std::string::npos;
    while (eol == std::string::npos) {
      if (have >= kMaxRequest) throw Error("its answer is not a snapshot server's");
      const std::size_t n = receive(kMaxRequest - have);
      if (n == 0) throw Error("the server closed the connection without an answer");
      const std::size_t from = have;
      have += n;
      for (std::size_t i = from; i < have; ++i)
        if (buf[i] == '\n') {
          eol = i;
          break;
        }
    }
    const std::string head(buf.data(), eol);
    if (head.rfind("ERR ", 0) == 0)
      throw Error(fmt::format("the server refused: {}", head.substr(4)));
    if (head.rfind("OK ", 0) != 0)
      throw Error(fmt::format("its answer is not a snapshot server's: '{}'", head));
    try {
      size = std::stoll(head.substr(3));
    } catch (const std::exception&) {
      throw Error(fmt::format("its answer is not a snapshot server's: '{}'", head));
    }
    out = UniqueFd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!out) throw Error(fmt::format("cannot create '{}': {}", tmp, errno_text(errno)));
    const auto write_all = [&](const char* p, std::size_t n) {
      while (n > 0) {
        const ssize_t w = ::write(out.get(), p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) throw Error(fmt::format("writing '{}': {}", tmp, errno_text(errno)));
        p += w;
        n -= static_cast<std::size_t>(w);
        got += w;
      }
    };
    // The bytes that came with the answer line.
    const std::size_t extra = have - eol - 1;
    if (static_cast<int64_t>(extra) > size) throw Error("the server sent more bytes than it said");
    write_all(buf.data() + eol + 1, extra);
    while (got < size) {
      have = 0;
      const std::size_t n = receive(
          static_cast<std::size_t>(std::min<int64_t>(size - got, static_cast<int64_t>(kChunk))));
      if (n == 0) throw Error("the server closed the connection");
      write_all(buf.data(), n);
    }
    out.reset();
    if (::rename(tmp.c_str(), dest.c_str()) != 0)
      throw Error(fmt::format("renaming '{}' to '{}': {}", tmp, dest, errno_text(errno)));
  } catch (const Error& e) {
    out.reset();
    ::unlink(tmp.c_str());
    throw Error(fmt::format(
        "copying the pause snapshot from {} to '{}' failed after {} of {} "
        "bytes: {}",
        endpoint, dest, got, size < 0 ? std::string("?") : std::to_string(size), e.what()));
  }
  SnapshotFetched r;
  r.bytes = got;
  r.ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  return r;
}

std::vector<std::string> snapshot_files(const std::string& run_dir) {
  if (run_dir.empty()) return {};
  std::vector<std::string> out{snapshot_path(run_dir)};
  if (std::string fallback = snapshot_fallback_path(run_dir); !fallback.empty())
    out.push_back(std::move(fallback));
  return out;
}

std::string local_address_towards(const std::string& host, uint16_t port) {
  asio::io_context io;
  boost::system::error_code ec;
  asio::ip::udp::resolver resolver(io);
  const auto found = resolver.resolve(host, std::to_string(port), ec);
  if (ec || found.empty())
    throw Error(fmt::format("'{}' does not resolve: {}", host, ec ? ec.message() : "no address"));
  std::string errors;
  for (const auto& r : found) {
    asio::ip::udp::socket s(io);
    s.open(r.endpoint().protocol(), ec);
    if (!ec) s.connect(r.endpoint(), ec);
    if (!ec) {
      const auto local = s.local_endpoint(ec);
      if (!ec) return local.address().to_string();
    }
    errors += fmt::format("{}{}", errors.empty() ? "" : "; ", ec.message());
  }
  throw Error(fmt::format("no route to {}:{}: {}", host, port, errors));
}

SnapshotFetcher::SnapshotFetcher(std::string run_id,
                                 std::function<std::vector<std::string>()> files,
                                 std::chrono::milliseconds timeout)
    : run_id_(std::move(run_id)), files_(std::move(files)), timeout_(timeout) {}

SnapshotFetcher::~SnapshotFetcher() {
  cancel_ = true;
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void SnapshotFetcher::start(const std::string& endpoint, int64_t serial,
                            std::function<void(const control::NodeEvent&)> done) {
  const std::vector<std::string> files = files_ ? files_() : std::vector<std::string>{};
  std::lock_guard<std::mutex> lock(mu_);
  threads_.emplace_back([this, endpoint, serial, files, done = std::move(done)] {
    control::NodeEvent e;
    e.kind = control::NodeEvent::Kind::kSnapshotFetched;
    e.serial = serial;
    try {
      if (files.empty()) throw Error("this node has no snapshot path");
      const SnapshotFetched f =
          fetch_snapshot(endpoint, run_id_, files.front(), timeout_, &cancel_);
      e.bytes = f.bytes;
      e.ms = f.ms;
      // An older snapshot at another of this node's paths would compete with the copy.
      std::error_code ec;
      for (std::size_t i = 1; i < files.size(); ++i)
        if (files[i] != files.front()) std::filesystem::remove(files[i], ec);
    } catch (const std::exception& err) {
      e.how = err.what();
    }
    done(e);
  });
}

}  // namespace gpurun::supervisor
