#include "store/session.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include "gpurun/error.hpp"
#include "store/server_state.hpp"

namespace gpurun::store {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

// Read buffer per session: small at first (thousands of idle rendezvous connections), grown
// to the large size the first time a read fills it (a client sending big values).
constexpr std::size_t kFirstReadBytes = 4 * 1024;
constexpr std::size_t kReadChunkBytes = 64 * 1024;
// A session stops handling requests while this many reply bytes wait to be written, so a
// client that sends without reading cannot grow the server's memory unbounded. With a small
// memory budget the bound is a quarter of the budget instead (at least 64 KiB), so that a few
// non-reading clients cannot take all of it before the budget refuses one of them.
constexpr std::size_t kMaxUnsentReplyBytes = 16u << 20;
// Buffers whose capacity grew past this are freed, not kept, once emptied: a connection that
// once moved a big value holds no big buffer while it idles.
constexpr std::size_t kKeepCapacityBytes = kReadChunkBytes;

std::string format_endpoint(const asio::ip::address& addr, uint16_t port) {
  if (addr.is_v6()) return fmt::format("[{}]:{}", addr.to_string(), port);
  return fmt::format("{}:{}", addr.to_string(), port);
}

std::size_t unsent_bound(const MemoryBudget& budget) {
  if (budget.limit_bytes() == 0) return kMaxUnsentReplyBytes;
  return std::clamp(budget.limit_bytes() / 4, kReadChunkBytes, kMaxUnsentReplyBytes);
}

template <class Buffer>
void free_if_big(Buffer& b) {
  if (b.empty() && b.capacity() > kKeepCapacityBytes) Buffer().swap(b);
}

}  // namespace

Session::Session(std::shared_ptr<ServerState> server, Socket socket, ConnectionId id)
    : server_(std::move(server)),
      socket_(std::move(socket)),
      executor_(socket_.get_executor()),
      id_(id),
      decoder_(server_->options.limits),
      charge_(server_->budget),
      max_unsent_bytes_(unsent_bound(server_->budget)) {
  error_code ec;
  auto ep = socket_.remote_endpoint(ec);
  peer_ = ec ? std::string("unknown peer") : format_endpoint(ep.address(), ep.port());
}

Session::~Session() = default;

std::string Session::budget_state() const {
  const MemoryBudget& b = server_->budget;
  return fmt::format(
      "the store's memory budget of {} ({} in use, {} of it by this connection; "
      "ServerOptions::memory_budget_bytes)",
      MemoryBudget::format_bytes(b.limit_bytes()), MemoryBudget::format_bytes(b.used_bytes()),
      MemoryBudget::format_bytes(charge_.held_bytes()));
}

void Session::start() {
  if (closing_) return;  // Server::close() ran before the session started
  if (!charge_.try_add(kFirstReadBytes)) {
    close(fmt::format("refused: its {}-byte read buffer does not fit {}", kFirstReadBytes,
                      budget_state()));
    return;
  }
  buf_.resize(kFirstReadBytes);
  do_read();
}

void Session::send_stop_waiting() {
  const std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return;
  charge_.add(1);  // bounded by the pending waits, which the budget admitted
  outbox_.push_back(static_cast<char>(kStopWaiting));
  if (flush_posted_) return;
  flush_posted_ = true;
  asio::post(executor_, [self = shared_from_this()] { self->on_flush_posted(); });
}

void Session::close(const std::string& reason, bool graceful) {
  if (closing_) {
    if (!graceful) finish_close();  // e.g. Server::close() during a graceful close
    return;
  }
  {
    const std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  if (!reason.empty()) {
    server_->log_close(fmt::format("store: closed connection from {}: {}", peer_, reason));
  }
  server_->backend.drop_connection(id_);  // no STOP_WAITING is queued after this
  if (graceful && (writing_ || unsent_bytes() > 0)) {
    // Only the replies are still needed: the request being received and the read buffers go.
    decoder_ = FrameDecoder(server_->options.limits);
    charge_.remove(request_bytes_ + backlog_bytes_);
    request_bytes_ = backlog_bytes_ = 0;
    std::vector<uint8_t>().swap(backlog_);
    start_write();
    return;  // on_write finishes the close
  }
  finish_close();
}

void Session::do_read() {
  if (closing_ || reading_) return;
  reading_ = true;
  socket_.async_read_some(
      asio::buffer(buf_),
      [self = shared_from_this()](error_code ec, std::size_t n) { self->on_read(ec, n); });
}

void Session::on_read(error_code ec, std::size_t n) {
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
  // Grows the read buffer when the budget has room; otherwise reads on in small steps.
  if (!closing_ && filled && buf_.size() < kReadChunkBytes &&
      charge_.try_add(kReadChunkBytes - buf_.size(), kReadChunkBytes)) {
    buf_.resize(kReadChunkBytes);
  }
  after_input();
}

// After handle_input(): sends the replies and reads on unless requests wait in the backlog or
// too many replies are unsent (on_write resumes then).
void Session::after_input() {
  if (closing_) return;
  queue_replies();
  start_write();
  server_->budget.maybe_trim();
  if (backlog_.empty() && unsent_bytes() <= max_unsent_bytes_) do_read();
}

bool Session::charge_request(std::size_t consumed) {
  if (consumed == 0) return true;
  request_bytes_ += consumed;
  if (charge_.try_add(consumed, request_bytes_)) return true;
  request_bytes_ -= consumed;
  queue_replies();
  close(fmt::format("{} request: receiving {} of it so far does not fit {}",
                    query_type_name(static_cast<uint8_t>(decoder_.request_type())),
                    MemoryBudget::format_bytes(request_bytes_ + consumed), budget_state()),
        true);
  return false;
}

bool Session::charge_reply(QueryType type, std::size_t before) {
  const std::size_t bytes = replies_.size() - before;
  if (charge_.try_add(bytes)) return true;
  replies_.resize(before);
  queue_replies();
  close(fmt::format("{} request: its reply of {} does not fit {}",
                    query_type_name(static_cast<uint8_t>(type)), MemoryBudget::format_bytes(bytes),
                    budget_state()),
        true);
  return false;
}

// Decodes and handles the requests in `input` in order. Stops early when the replies not yet
// written pass max_unsent_bytes_ (a client sending requests without reading the answers): the
// rest of `input` waits in backlog_ until the writes drain, so one connection's memory stays
// bounded by the limit plus one reply. May close the session (bad request, budget refused).
void Session::handle_input(std::span<const uint8_t> input) {
  Request req;
  while (!closing_) {
    const std::size_t before = input.size();
    const auto status = decoder_.decode(input, req);
    if (status == FrameDecoder::Status::kError) {
      queue_replies();
      close(fmt::format("bad request: {}", decoder_.error()), true);
      return;
    }
    if (!charge_request(before - input.size())) return;
    if (status == FrameDecoder::Status::kNeedMore) break;
    // A WAIT queues the replies before it (see handle()): do it first, so that replies_
    // holds only this request's reply afterwards.
    if (req.type == QueryType::kWait) queue_replies();
    const std::size_t replies_before = replies_.size();
    const QueryType type = req.type;
    try {
      handle(req);
    } catch (const StoreError& e) {
      queue_replies();
      close(e.what(), true);
      return;
    }
    // The request is handled: what the backend keeps of it is charged there.
    req = Request();
    charge_.remove(request_bytes_);
    request_bytes_ = 0;
    if (!charge_reply(type, replies_before)) return;
    if (!input.empty() && replies_.size() + unsent_bytes() > max_unsent_bytes_) {
      backlog_.assign(input.begin(), input.end());
      if (!charge_.try_add(backlog_.size(), backlog_.size())) {
        std::vector<uint8_t>().swap(backlog_);
        queue_replies();
        close(fmt::format("{} bytes of pipelined requests do not fit {}", input.size(),
                          budget_state()),
              true);
        return;
      }
      backlog_bytes_ = backlog_.size();
      return;
    }
  }
}

// After a write: handles the backlog once the unsent replies are under the limit again, then
// reads more.
void Session::resume_input() {
  if (closing_ || unsent_bytes() > max_unsent_bytes_) return;
  if (backlog_.empty()) {
    do_read();
    return;
  }
  std::vector<uint8_t> input;
  input.swap(backlog_);
  charge_.remove(backlog_bytes_);
  backlog_bytes_ = 0;
  handle_input(input);
  after_input();
}

// Moves the replies produced so far in this read (replies_) to the outbox.
void Session::queue_replies() {
  if (replies_.empty()) return;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    outbox_.append(replies_);
  }
  replies_.clear();
  free_if_big(replies_);
}

void Session::handle(Request& req) {
  Backend& b = server_->backend;
  MemoryBudget& budget = server_->budget;
  constexpr Admit kAdmit = Admit::kWithinBudget;
  // Replies copied out of the store are checked against the budget before they are copied.
  const std::size_t max_reply =
      std::max(budget.available_bytes(SIZE_MAX), MemoryBudget::kSmallChargeBytes);
  std::string& out = replies_;
  switch (req.type) {
    case QueryType::kValidate:
      break;
    case QueryType::kSet:
      b.set(req.keys[0], std::move(req.values[0]), kAdmit);
      if (req.keys[0].rfind(kLivePrefix, 0) == 0) b.bind_live(id_, req.keys[0]);
      break;
    case QueryType::kCompareSet:
      put_bytes(out, b.compare_set(req.keys[0], req.values[0], std::move(req.values[1]), kAdmit));
      break;
    case QueryType::kGet:
      put_bytes(out, b.get(req.keys[0], max_reply));
      break;
    case QueryType::kAdd:
      put_i64(out, b.add(req.keys[0], req.delta, kAdmit));
      break;
    case QueryType::kCheck:
      put_u8(out, b.check(req.keys) ? kCheckReady : kCheckNotReady);
      break;
    case QueryType::kWait:
      // Once registered, the wait may complete on another thread at once and queue its
      // STOP_WAITING: the replies to earlier requests must be queued first.
      queue_replies();
      if (b.wait(id_, req.keys, kAdmit)) put_u8(out, kStopWaiting);
      break;
    case QueryType::kGetNumKeys:
      put_i64(out, b.num_keys());
      break;
    case QueryType::kDeleteKey:
      put_i64(out, b.delete_key(req.keys[0]) ? 1 : 0);
      break;
    case QueryType::kAppend:
      b.append(req.keys[0], req.values[0], kAdmit);
      break;
    case QueryType::kMultiGet:
      for (auto& v : b.multi_get(req.keys, max_reply)) put_bytes(out, v);
      break;
    case QueryType::kMultiSet:
      b.multi_set(req.keys, std::move(req.values), kAdmit);
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
      b.queue_push(req.keys[0], std::move(req.values[0]), kAdmit);
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

std::size_t Session::unsent_bytes() {
  const std::lock_guard<std::mutex> lock(mu_);
  return outbox_.size() + inflight_.size();
}

void Session::on_flush_posted() {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    flush_posted_ = false;
  }
  start_write();
}

void Session::start_write() {
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

void Session::release_memory() {
  decoder_ = FrameDecoder(server_->options.limits);
  std::vector<uint8_t>().swap(buf_);
  std::vector<uint8_t>().swap(backlog_);
  std::string().swap(replies_);
  {
    const std::lock_guard<std::mutex> lock(mu_);
    std::string().swap(outbox_);
    if (!writing_) std::string().swap(inflight_);  // else on_write frees it
  }
  request_bytes_ = backlog_bytes_ = 0;
  charge_.release_all();
  server_->budget.maybe_trim();
}

void Session::finish_close() {
  if (closed_) return;
  closed_ = true;
  server_->forget_session(id_);
  error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  release_memory();
}

void Session::on_write(error_code ec) {
  writing_ = false;
  charge_.remove(inflight_.size());
  {
    const std::lock_guard<std::mutex> lock(mu_);
    inflight_.clear();
    free_if_big(inflight_);
  }
  if (closed_) {
    server_->budget.maybe_trim();  // the last buffer of a closed session is gone now
    return;
  }
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

}  // namespace gpurun::store
