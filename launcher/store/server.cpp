#include "store/server.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include "gpurun/check.hpp"

namespace gpurun::store {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

// Bytes read from a socket per read operation.
// Read buffer per session: small at first (thousands of idle rendezvous connections), grown
// to the large size the first time a read fills it (a client sending big values).
constexpr std::size_t kFirstReadBytes = 4 * 1024;
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

// Socket bound to a concrete io_context executor: no type-erased dispatch per handler.
using Socket = tcp::socket::rebind_executor<asio::io_context::executor_type>::other;

// The reactor threads of a server with ServerOptions::threads >= 2: one
// io_context per thread, each kept running by a work guard until stop().
class Server::Reactors {
 public:
  explicit Reactors(std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      contexts_.push_back(std::make_unique<asio::io_context>(1));
      work_.emplace_back(contexts_.back()->get_executor());
    }
  }
  ~Reactors() { stop(); }
  Reactors(const Reactors&) = delete;
  Reactors& operator=(const Reactors&) = delete;

  void start() {
    for (auto& ctx : contexts_) threads_.emplace_back([io = ctx.get()] { io->run(); });
  }
  // Stops every io_context and joins its thread; pending handlers stay queued
  // until the contexts are destroyed.
  void stop() {
    work_.clear();
    for (auto& ctx : contexts_) ctx->stop();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  std::vector<asio::io_context*> contexts() const {
    std::vector<asio::io_context*> out;
    for (const auto& ctx : contexts_) out.push_back(ctx.get());
    return out;
  }

 private:
  std::vector<std::unique_ptr<asio::io_context>> contexts_;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::vector<std::thread> threads_;
};

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  Impl(asio::io_context& io_context, ServerOptions opts, std::vector<asio::io_context*> ctxs)
      : io(io_context),
        options(std::move(opts)),
        backend(options.limits),
        reactors(std::move(ctxs)),
        io_work(io.get_executor()) {}

  bool single_threaded() const { return reactors.size() == 1 && reactors[0] == &io; }
  // Logs from any thread: at once on io's thread (single-threaded), else posted to io.
  void log(std::string line) {
    if (!options.log) return;
    if (single_threaded()) {
      options.log(line);
      return;
    }
    asio::post(io, [self = shared_from_this(), line = std::move(line)] {
      if (self->log_open) self->options.log(line);
    });
  }
  // Runs on the constructing thread (io's), so it logs directly.
  void listen_all();
  void log_now(const std::string& line) const {
    if (options.log) options.log(line);
  }
  // Opens, binds and listens one acceptor; returns the error instead of throwing.
  error_code listen_one(const asio::ip::address& addr, uint16_t port, bool dual_stack);
  void do_accept(std::size_t index);
  void on_accept(std::size_t index, error_code ec, Socket socket);
  // Runs f on `ctx`'s thread and waits for it (inline when single-threaded).
  void run_on(asio::io_context& ctx, const std::function<void()>& f);
  void close();
  void forget_session(ConnectionId id);
  std::shared_ptr<Session> find_session(ConnectionId id);

  asio::io_context& io;  // the caller's: logs run here; single-threaded: everything
  ServerOptions options;
  Backend backend;
  // Where sessions run; reactors[0] also runs the acceptors. {&io} when single-threaded.
  std::vector<asio::io_context*> reactors;
  std::vector<std::unique_ptr<tcp::acceptor>> acceptors;  // reactors[0]'s thread only
  std::vector<std::size_t> next_reactor;                  // per acceptor; reactors[0]'s thread only
  ConnectionId next_id = 1;                               // reactors[0]'s thread only
  uint16_t bound_port = 0;
  // Keeps io.run() from returning while the server is open (the acceptors did
  // that when they ran on io); released by close().
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> io_work;
  std::atomic<bool> closed{false};  // written under sessions_mu
  bool log_open = true;             // io's thread only; false once ~Server ran

  mutable std::mutex sessions_mu;  // taken after (never before) the backend's mutex
  std::unordered_map<ConnectionId, std::weak_ptr<Session>> sessions;
};

// One client connection: read → decode → answer in order; single writer.
// Everything runs on the session's reactor thread except send_stop_waiting(),
// which any thread may call (from the backend's notify); the reply queue
// (outbox_) and closing_ are therefore guarded by mu_.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<Server::Impl> server, Socket socket, ConnectionId id)
      : server_(std::move(server)),
        socket_(std::move(socket)),
        executor_(socket_.get_executor()),
        id_(id),
        decoder_(server_->options.limits),
        buf_(kFirstReadBytes) {
    error_code ec;
    auto ep = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("unknown peer") : format_endpoint(ep.address(), ep.port());
  }

  const asio::io_context::executor_type& executor() const { return executor_; }

  void start() { do_read(); }

  /// Any thread, called with the backend's mutex held: queues a STOP_WAITING
  /// for a completed WAIT and has the session's thread write it.
  void send_stop_waiting() {
    const std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
    outbox_.push_back(static_cast<char>(kStopWaiting));
    if (flush_posted_) return;
    flush_posted_ = true;
    asio::post(executor_, [self = shared_from_this()] { self->on_flush_posted(); });
  }

  /// Ends the session: drops its waits and logs `reason` if non-empty. With
  /// `graceful`, replies already produced are written first (a client that
  /// pipelined good requests before a bad one gets their answers).
  void close(const std::string& reason, bool graceful = false) {
    if (closing_) {
      if (!graceful) finish_close();  // e.g. Server::close() during a graceful close
      return;
    }
    {
      const std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
    }
    if (!reason.empty()) {
      server_->log(fmt::format("store: closed connection from {}: {}", peer_, reason));
    }
    server_->backend.drop_connection(id_);  // no STOP_WAITING is queued after this
    if (graceful && (writing_ || unsent_bytes() > 0)) {
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
        asio::buffer(buf_),
        [self = shared_from_this()](error_code ec, std::size_t n) { self->on_read(ec, n); });
  }

  void on_read(error_code ec, std::size_t n) {
    reading_ = false;
    if (closing_) return;
    if (ec) {
      if (ec == asio::error::eof || ec == asio::error::connection_reset) {
        // A client going away (also with replies it did not read) is not an error.
        close(decoder_.mid_request() ? "connection closed in the middle of a request" : "");
      } else if (ec != asio::error::operation_aborted) {
        close(fmt::format("read failed: {}", ec.message()));
      }
      return;
    }
    const bool filled = n == buf_.size();
    handle_input(std::span<const uint8_t>(buf_.data(), n));
    if (filled && buf_.size() < kReadChunkBytes) buf_.resize(kReadChunkBytes);
    after_input();
  }

  // After handle_input(): sends the replies and reads on unless requests wait in the backlog
  // or too many replies are unsent (on_write resumes then).
  void after_input() {
    if (closing_) return;
    queue_replies();
    start_write();
    if (backlog_.empty() && unsent_bytes() <= kMaxUnsentReplyBytes) do_read();
  }

  // Decodes and handles the requests in `input` in order. Stops early when the replies not yet
  // written pass kMaxUnsentReplyBytes (a client sending requests without reading the answers):
  // the rest of `input` waits in backlog_ until the writes drain, so one connection's memory
  // stays bounded by the limit plus one reply. May close the session (bad request).
  void handle_input(std::span<const uint8_t> input) {
    Request req;
    while (!closing_) {
      const auto status = decoder_.decode(input, req);
      if (status == FrameDecoder::Status::kNeedMore) break;
      if (status == FrameDecoder::Status::kError) {
        queue_replies();
        close(fmt::format("bad request: {}", decoder_.error()), true);
        return;
      }
      try {
        handle(req);
      } catch (const StoreError& e) {
        queue_replies();
        close(e.what(), true);
        return;
      }
      if (!input.empty() && replies_.size() + unsent_bytes() > kMaxUnsentReplyBytes) {
        backlog_.assign(input.begin(), input.end());
        return;
      }
    }
  }

  // After a write: handles the backlog once the unsent replies are under the limit again,
  // then reads more.
  void resume_input() {
    if (closing_ || unsent_bytes() > kMaxUnsentReplyBytes) return;
    if (backlog_.empty()) {
      do_read();
      return;
    }
    std::vector<uint8_t> input;
    input.swap(backlog_);
    handle_input(input);
    after_input();
  }

  // Moves the replies produced so far in this read (replies_) to the outbox.
  void queue_replies() {
    if (replies_.empty()) return;
    const std::lock_guard<std::mutex> lock(mu_);
    outbox_.append(replies_);
    replies_.clear();
  }

  void handle(Request& req) {
    Backend& b = server_->backend;
    std::string& out = replies_;
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
        // Once registered, the wait may complete on another thread at once and
        // queue its STOP_WAITING: the replies to earlier requests must be queued first.
        queue_replies();
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
        for (auto& v : b.multi_get(req.keys)) put_bytes(out, v);
        break;
      case QueryType::kMultiSet:
        b.multi_set(req.keys, std::move(req.values));
        break;
      case QueryType::kCancelWait:
        // A STOP_WAITING that completed before this is already in the outbox.
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

  std::size_t unsent_bytes() {
    const std::lock_guard<std::mutex> lock(mu_);
    return outbox_.size() + inflight_.size();
  }

  void on_flush_posted() {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      flush_posted_ = false;
    }
    start_write();
  }

  void start_write() {
    if (closed_ || writing_) return;
    {
      const std::lock_guard<std::mutex> lock(mu_);
      if (outbox_.empty()) return;
      inflight_.swap(outbox_);  // inflight_ is empty: no write in progress
    }
    writing_ = true;
    asio::async_write(
        socket_, asio::buffer(inflight_),
        [self = shared_from_this()](error_code ec, std::size_t) { self->on_write(ec); });
  }

  void finish_close() {
    if (closed_) return;
    closed_ = true;
    server_->forget_session(id_);
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
      if (ec == asio::error::broken_pipe || ec == asio::error::connection_reset) {
        close("");  // the client went away without reading its replies: not an error
      } else if (ec != asio::error::operation_aborted) {
        close(fmt::format("write failed: {}", ec.message()));
      }
      return;
    }
    start_write();
    resume_input();
  }

  std::shared_ptr<Server::Impl> server_;
  Socket socket_;
  const asio::io_context::executor_type executor_;
  ConnectionId id_;
  std::string peer_;
  FrameDecoder decoder_;
  std::vector<uint8_t> buf_;      // read buffer (kFirstReadBytes, grown to kReadChunkBytes)
  std::vector<uint8_t> backlog_;  // requests read but not handled yet: replies over the limit
  std::string replies_;           // replies produced by the read being handled, not yet queued
  bool reading_ = false;
  bool writing_ = false;
  bool closed_ = false;  // socket closed

  std::mutex mu_;         // guards the members below; taken after the backend's mutex
  std::string outbox_;    // replies not yet handed to the socket
  std::string inflight_;  // the write in progress (this thread only; read under mu_)
  bool flush_posted_ = false;
  bool closing_ = false;  // no more requests or replies; waits dropped (read unlocked here)
};

// ---- Server::Impl ---------------------------------------------------------------

error_code Server::Impl::listen_one(const asio::ip::address& addr, uint16_t port, bool dual_stack) {
  auto acc = std::make_unique<tcp::acceptor>(*reactors[0]);
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
      log_now(fmt::format("store: cannot listen on {} ({}); falling back to 0.0.0.0",
                          format_host_port(host, port), ec.message()));
      ec = listen_one(asio::ip::address_v4::any(), port, false);
    }
    if (!ec) continue;
    const bool optional = i > 0 && address_unusable(ec);
    if (optional) {
      log_now(fmt::format("store: skipping {} ({}); not listening there",
                          format_host_port(host, port), ec.message()));
      continue;
    }
    throw StoreError(
        fmt::format("cannot listen on {}: {}", format_host_port(host, port), ec.message()));
  }
  next_reactor.assign(acceptors.size(), 0);
  for (std::size_t i = 0; i < acceptors.size(); ++i) do_accept(i);
}

void Server::Impl::do_accept(std::size_t index) {
  if (closed) return;
  // The new connection's socket is created on the reactor that will run its
  // session: round-robin, counted per acceptor so that the connections to one
  // address go to reactors 0, 1, 2, ... in accept order.
  const std::size_t reactor = next_reactor[index];
  next_reactor[index] = (reactor + 1) % reactors.size();
  acceptors[index]->async_accept(*reactors[reactor],
                                 [self = shared_from_this(), index](error_code ec, Socket socket) {
                                   self->on_accept(index, ec, std::move(socket));
                                 });
}

void Server::Impl::on_accept(std::size_t index, error_code ec, Socket socket) {
  if (closed || ec == asio::error::operation_aborted) return;
  if (ec) {
    log(fmt::format("store: accept failed: {}", ec.message()));
    // Out of descriptors or memory: back off briefly instead of spinning.
    auto timer = std::make_shared<asio::steady_timer>(*reactors[0], std::chrono::milliseconds(100));
    timer->async_wait(
        [self = shared_from_this(), index, timer](error_code) { self->do_accept(index); });
    return;
  }
  error_code opt_ec;
  socket.set_option(tcp::no_delay(true), opt_ec);
  const ConnectionId id = next_id++;
  auto session = std::make_shared<Session>(shared_from_this(), std::move(socket), id);
  {
    const std::lock_guard<std::mutex> lock(sessions_mu);
    if (closed) return;  // close() ran meanwhile: the session's socket closes with it
    sessions.emplace(id, session);
  }
  // Inline when the session's reactor is this thread (always when single-threaded).
  asio::dispatch(session->executor(), [session] { session->start(); });
  do_accept(index);
}

void Server::Impl::forget_session(ConnectionId id) {
  const std::lock_guard<std::mutex> lock(sessions_mu);
  sessions.erase(id);
}

std::shared_ptr<Session> Server::Impl::find_session(ConnectionId id) {
  const std::lock_guard<std::mutex> lock(sessions_mu);
  auto it = sessions.find(id);
  return it == sessions.end() ? nullptr : it->second.lock();
}

void Server::Impl::run_on(asio::io_context& ctx, const std::function<void()>& f) {
  if (single_threaded() || ctx.get_executor().running_in_this_thread()) {
    f();
    return;
  }
  std::promise<void> done;
  asio::post(ctx, [&] {
    f();
    done.set_value();
  });
  done.get_future().wait();
}

void Server::Impl::close() {
  std::vector<std::shared_ptr<Session>> open;
  {
    const std::lock_guard<std::mutex> lock(sessions_mu);
    if (closed) return;
    closed = true;
    for (auto& [id, weak] : sessions) {
      if (auto s = weak.lock()) open.push_back(std::move(s));
    }
    sessions.clear();
  }
  // Each object is closed on the thread that runs it; reactor threads never
  // wait for io's thread, so waiting for them here cannot deadlock.
  run_on(*reactors[0], [this] {
    for (auto& acc : acceptors) {
      error_code ec;
      acc->close(ec);
    }
  });
  for (asio::io_context* ctx : reactors) {
    run_on(*ctx, [&open, ctx] {
      for (auto& s : open) {
        if (&s->executor().context() == ctx) s->close("");
      }
    });
  }
  io_work.reset();
}

// ---- Server ---------------------------------------------------------------------

std::size_t default_server_threads() {
  const unsigned cores = std::thread::hardware_concurrency();
  return std::clamp<std::size_t>(cores, 1, 8);
}

Server::Server(asio::io_context& io, ServerOptions options) {
  if (options.threads == 0) options.threads = default_server_threads();
  std::vector<asio::io_context*> contexts{&io};
  if (options.threads >= 2) {
    reactors_ = std::make_unique<Reactors>(options.threads);
    contexts = reactors_->contexts();
  }
  impl_ = std::make_shared<Impl>(io, std::move(options), std::move(contexts));
  Impl* impl = impl_.get();
  impl_->backend.set_notify([impl](ConnectionId conn) {
    // Runs with the backend's mutex held, on the thread of the completing write.
    if (auto s = impl->find_session(conn)) s->send_stop_waiting();
  });
  impl_->listen_all();
  if (reactors_) reactors_->start();
}

Server::~Server() {
  impl_->close();
  impl_->log_open = false;
  if (reactors_) {
    reactors_->stop();
    // The acceptors belong to a reactor's io_context: destroy them before it.
    impl_->acceptors.clear();
  }
  // Members go in reverse order: impl_ (handlers may still hold the Impl),
  // then reactors_, whose io_contexts destroy their queued handlers.
}

uint16_t Server::port() const {
  return impl_->bound_port;
}

std::size_t Server::threads() const {
  return impl_->reactors.size();
}

void Server::close() {
  impl_->close();
}

void Server::reset_keyspace(std::string_view keep_prefix) {
  impl_->backend.reset_keyspace(keep_prefix);
}

std::size_t Server::num_sessions() const {
  const std::lock_guard<std::mutex> lock(impl_->sessions_mu);
  return impl_->sessions.size();
}

Backend& Server::backend() {
  return impl_->backend;
}

}  // namespace gpurun::store
