#include "store/server.hpp"

#include <array>
#include <memory>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include "common/error.hpp"

namespace gpurun::store {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

// Bytes read from a socket per read operation.
constexpr std::size_t kReadChunkBytes = 64 * 1024;
// A session stops reading while this many reply bytes wait to be written, so a
// client that sends without reading cannot grow the server's memory unbounded.
constexpr std::size_t kMaxUnsentReplyBytes = 16u << 20;

std::string format_endpoint(const asio::ip::address& addr, uint16_t port) {
  if (addr.is_v6()) return fmt::format("[{}]:{}", addr.to_string(), port);
  return fmt::format("{}:{}", addr.to_string(), port);
}

std::string format_host_port(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

// The host has no such address or address family (e.g. IPv6 disabled).
bool address_unusable(const error_code& ec) {
  return ec == boost::system::errc::address_not_available ||
         ec == boost::system::errc::address_family_not_supported ||
         ec == asio::error::address_family_not_supported;
}

}  // namespace

class Session;

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  Impl(asio::io_context& io_context, ServerOptions opts)
      : io(io_context), options(std::move(opts)), backend(options.limits) {}

  void log(const std::string& line) const {
    if (options.log) options.log(line);
  }
  void listen_all();
  // Opens, binds and listens one acceptor; returns the error instead of throwing.
  error_code listen_one(const asio::ip::address& addr, uint16_t port, bool dual_stack);
  void do_accept(std::size_t index);
  void on_accept(std::size_t index, error_code ec, tcp::socket socket);
  void close();

  asio::io_context& io;
  ServerOptions options;
  Backend backend;
  std::vector<std::unique_ptr<tcp::acceptor>> acceptors;
  std::unordered_map<ConnectionId, std::weak_ptr<Session>> sessions;
  ConnectionId next_id = 1;
  uint16_t bound_port = 0;
  bool closed = false;
};

// One client connection: read → decode → answer in order; single writer.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<Server::Impl> server, tcp::socket socket, ConnectionId id)
      : server_(std::move(server)),
        socket_(std::move(socket)),
        id_(id),
        decoder_(server_->options.limits),
        buf_(std::make_unique<std::array<uint8_t, kReadChunkBytes>>()) {
    error_code ec;
    auto ep = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("unknown peer") : format_endpoint(ep.address(), ep.port());
  }

  void start() { do_read(); }

  /// Queues reply bytes (e.g. a late STOP_WAITING) and starts writing.
  void send(std::string_view bytes) {
    if (closing_) return;
    outbox_.append(bytes);
    flush();
  }

  /// Ends the session: drops its waits and logs `reason` if non-empty. With
  /// `graceful`, replies already produced are written first (a client that
  /// pipelined good requests before a bad one gets their answers).
  void close(const std::string& reason, bool graceful = false) {
    if (closing_) {
      if (!graceful) finish_close();  // e.g. Server::close() during a graceful close
      return;
    }
    closing_ = true;
    if (!reason.empty()) {
      server_->log(fmt::format("store: closed connection from {}: {}", peer_, reason));
    }
    server_->backend.drop_connection(id_);
    if (graceful && (writing_ || !outbox_.empty())) {
      start_write();
      return;  // on_write finishes the close
    }
    finish_close();
  }

 private:
  void do_read() {
    if (closing_ || reading_) return;
    reading_ = true;
    socket_.async_read_some(
        asio::buffer(*buf_),
        [self = shared_from_this()](error_code ec, std::size_t n) { self->on_read(ec, n); });
  }

  void on_read(error_code ec, std::size_t n) {
    reading_ = false;
    if (closing_) return;
    if (ec) {
      if (ec == asio::error::eof) {
        close(decoder_.mid_request() ? "connection closed in the middle of a request" : "");
      } else if (ec != asio::error::operation_aborted) {
        close(fmt::format("read failed: {}", ec.message()));
      }
      return;
    }
    std::span<const uint8_t> input(buf_->data(), n);
    Request req;
    while (!closing_) {
      const auto status = decoder_.decode(input, req);
      if (status == FrameDecoder::Status::kNeedMore) break;
      if (status == FrameDecoder::Status::kError) {
        close(fmt::format("bad request: {}", decoder_.error()), true);
        return;
      }
      try {
        handle(req);
      } catch (const StoreError& e) {
        close(e.what(), true);
        return;
      }
    }
    if (closing_) return;
    flush();
    if (outbox_.size() + inflight_.size() <= kMaxUnsentReplyBytes) do_read();
  }

  void handle(Request& req) {
    Backend& b = server_->backend;
    std::string& out = outbox_;
    switch (req.type) {
      case QueryType::kValidate:
        break;
      case QueryType::kSet:
        b.set(req.keys[0], std::move(req.values[0]));
        break;
      case QueryType::kCompareSet:
        put_bytes(out, b.compare_set(req.keys[0], req.values[0], std::move(req.values[1])));
        break;
      case QueryType::kGet:
        put_bytes(out, b.get(req.keys[0]));
        break;
      case QueryType::kAdd:
        put_i64(out, b.add(req.keys[0], req.delta));
        break;
      case QueryType::kCheck:
        put_u8(out, b.check(req.keys) ? kCheckReady : kCheckNotReady);
        break;
      case QueryType::kWait:
        if (b.wait(id_, req.keys)) put_u8(out, kStopWaiting);
        break;
      case QueryType::kGetNumKeys:
        put_i64(out, b.num_keys());
        break;
      case QueryType::kDeleteKey:
        put_i64(out, b.delete_key(req.keys[0]) ? 1 : 0);
        break;
      case QueryType::kAppend:
        b.append(req.keys[0], req.values[0]);
        break;
      case QueryType::kMultiGet:
        for (const auto& k : req.keys) put_bytes(out, b.get(k));
        break;
      case QueryType::kMultiSet:
        b.multi_set(req.keys, std::move(req.values));
        break;
      case QueryType::kCancelWait:
        b.cancel_waits(id_);
        put_u8(out, kWaitCanceled);
        break;
      case QueryType::kPing:
        put_u32(out, req.u32);
        break;
      case QueryType::kQueuePush:
        b.queue_push(req.keys[0], std::move(req.values[0]));
        break;
      case QueryType::kQueuePop: {
        auto [len, head] = b.queue_pop(req.keys[0]);
        put_i64(out, len);
        if (head) put_bytes(out, *head);
        break;
      }
      case QueryType::kQueueLen:
        put_i64(out, b.queue_len(req.keys[0]));
        break;
      case QueryType::kListKeys: {
        auto keys = b.list_keys();
        put_i64(out, static_cast<int64_t>(keys.size()));
        for (const auto& k : keys) put_bytes(out, k);
        break;
      }
    }
  }

  void flush() {
    if (closing_) return;
    start_write();
  }

  void start_write() {
    if (closed_ || writing_ || outbox_.empty()) return;
    writing_ = true;
    inflight_.swap(outbox_);
    outbox_.clear();
    asio::async_write(
        socket_, asio::buffer(inflight_),
        [self = shared_from_this()](error_code ec, std::size_t) { self->on_write(ec); });
  }

  void finish_close() {
    if (closed_) return;
    closed_ = true;
    server_->sessions.erase(id_);
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }

  void on_write(error_code ec) {
    writing_ = false;
    inflight_.clear();
    if (closed_) return;
    if (closing_) {
      if (!ec) start_write();
      if (ec || !writing_) finish_close();
      return;
    }
    if (ec) {
      if (ec != asio::error::operation_aborted)
        close(fmt::format("write failed: {}", ec.message()));
      return;
    }
    flush();
    if (outbox_.size() + inflight_.size() <= kMaxUnsentReplyBytes) do_read();
  }

  std::shared_ptr<Server::Impl> server_;
  tcp::socket socket_;
  ConnectionId id_;
  std::string peer_;
  FrameDecoder decoder_;
  std::unique_ptr<std::array<uint8_t, kReadChunkBytes>> buf_;
  std::string outbox_;    // replies not yet handed to the socket
  std::string inflight_;  // the write in progress
  bool reading_ = false;
  bool writing_ = false;
  bool closing_ = false;  // no more requests or replies; waits dropped
  bool closed_ = false;   // socket closed
};

// ---- Server::Impl ---------------------------------------------------------------

error_code Server::Impl::listen_one(const asio::ip::address& addr, uint16_t port, bool dual_stack) {
  auto acc = std::make_unique<tcp::acceptor>(io);
  const tcp::endpoint ep(addr, port);
  error_code ec;
  acc->open(ep.protocol(), ec);
  if (ec) return ec;
  acc->set_option(asio::socket_base::reuse_address(true), ec);
  if (ec) return ec;
  if (addr.is_v6()) {
    acc->set_option(asio::ip::v6_only(!dual_stack), ec);
    if (ec) return ec;
  }
  acc->bind(ep, ec);
  if (ec) return ec;
  acc->listen(options.backlog, ec);
  if (ec) return ec;
  if (bound_port == 0) bound_port = acc->local_endpoint().port();
  acceptors.push_back(std::move(acc));
  return {};
}

void Server::Impl::listen_all() {
  GPURUN_CHECK(!options.hosts.empty(), "ServerOptions::hosts is empty");
  for (std::size_t i = 0; i < options.hosts.size(); ++i) {
    const std::string& host = options.hosts[i];
    const uint16_t port = bound_port != 0 ? bound_port : options.port;
    error_code ec;
    asio::ip::address addr = asio::ip::make_address(host, ec);
    if (ec) {
      // Not an address literal: resolve the name and take its first address.
      tcp::resolver resolver(io);
      auto results = resolver.resolve(host, std::to_string(port), ec);
      if (ec || results.empty()) {
        throw StoreError(fmt::format("cannot listen on {}: cannot resolve host: {}",
                                     format_host_port(host, port),
                                     ec ? ec.message() : std::string("no address")));
      }
      addr = results.begin()->endpoint().address();
    }
    const bool wildcard_v6 = addr.is_v6() && addr.is_unspecified();
    ec = listen_one(addr, port, wildcard_v6);
    if (ec && wildcard_v6 && address_unusable(ec)) {
      log(fmt::format("store: cannot listen on {} ({}); falling back to 0.0.0.0",
                      format_host_port(host, port), ec.message()));
      ec = listen_one(asio::ip::address_v4::any(), port, false);
    }
    if (!ec) continue;
    const bool optional = i > 0 && address_unusable(ec);
    if (optional) {
      log(fmt::format("store: skipping {} ({}); not listening there", format_host_port(host, port),
                      ec.message()));
      continue;
    }
    throw StoreError(
        fmt::format("cannot listen on {}: {}", format_host_port(host, port), ec.message()));
  }
  for (std::size_t i = 0; i < acceptors.size(); ++i) do_accept(i);
}

void Server::Impl::do_accept(std::size_t index) {
  if (closed) return;
  acceptors[index]->async_accept(
      io, [self = shared_from_this(), index](error_code ec, tcp::socket socket) {
        self->on_accept(index, ec, std::move(socket));
      });
}

void Server::Impl::on_accept(std::size_t index, error_code ec, tcp::socket socket) {
  if (closed || ec == asio::error::operation_aborted) return;
  if (ec) {
    log(fmt::format("store: accept failed: {}", ec.message()));
    // Out of descriptors or memory: back off briefly instead of spinning.
    auto timer = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(100));
    timer->async_wait(
        [self = shared_from_this(), index, timer](error_code) { self->do_accept(index); });
    return;
  }
  error_code opt_ec;
  socket.set_option(tcp::no_delay(true), opt_ec);
  const ConnectionId id = next_id++;
  auto session = std::make_shared<Session>(shared_from_this(), std::move(socket), id);
  sessions.emplace(id, session);
  session->start();
  do_accept(index);
}

void Server::Impl::close() {
  if (closed) return;
  closed = true;
  for (auto& acc : acceptors) {
    error_code ec;
    acc->close(ec);
  }
  std::vector<std::shared_ptr<Session>> open;
  for (auto& [id, weak] : sessions) {
    if (auto s = weak.lock()) open.push_back(std::move(s));
  }
  for (auto& s : open) s->close("");
  sessions.clear();
}

// ---- Server ---------------------------------------------------------------------

Server::Server(asio::io_context& io, ServerOptions options)
    : impl_(std::make_shared<Impl>(io, std::move(options))) {
  Impl* impl = impl_.get();
  impl_->backend.set_notify([impl](ConnectionId conn) {
    auto it = impl->sessions.find(conn);
    if (it == impl->sessions.end()) return;
    if (auto s = it->second.lock()) {
      const char stop = static_cast<char>(kStopWaiting);
      s->send(std::string_view(&stop, 1));
    }
  });
  impl_->listen_all();
}

Server::~Server() {
  impl_->close();
}

uint16_t Server::port() const {
  return impl_->bound_port;
}

void Server::close() {
  impl_->close();
}

void Server::reset_keyspace(std::string_view keep_prefix) {
  impl_->backend.reset_keyspace(keep_prefix);
}

std::size_t Server::num_sessions() const {
  return impl_->sessions.size();
}

Backend& Server::backend() {
  return impl_->backend;
}

}  // namespace gpurun::store
