#include "gpurun/store/client.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "gpurun/check.hpp"

namespace gpurun::store {

namespace {

using Clock = std::chrono::steady_clock;

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

long long elapsed_ms(Clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count();
}

std::string errno_text(int err) {
  return std::strerror(err);
}

std::string key_list(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i == 4 && keys.size() > 5) {
      out += fmt::format(", ... ({} more)", keys.size() - 4);
      break;
    }
    if (i > 0) out += ", ";
    out += printable(keys[i]);
  }
  return out + "]";
}

// How long PING must have gone unanswered before a silent listener counts as not a store.
constexpr long long kMinPingWaitMs = 100;

// Thrown (as StoreTimeout) after a wait timed out and was cleanly cancelled:
// the connection stays usable.
class CleanWaitTimeout : public StoreTimeout {
 public:
  using StoreTimeout::StoreTimeout;
};

}  // namespace

NotAStoreError::NotAStoreError(const std::string& peer, std::string seen)
    : StoreError(fmt::format("{} answers but is not a TCPStore ({})", peer, seen)),
      seen_(std::move(seen)) {}

Client::Client(ClientOptions options) : options_(std::move(options)) {
  // "[::1]" (the URL form users give --master-addr) is the address ::1 to getaddrinfo.
  if (options_.host.size() > 2 && options_.host.front() == '[' && options_.host.back() == ']')
    options_.host = options_.host.substr(1, options_.host.size() - 2);
  peer_ = options_.host.find(':') != std::string::npos
              ? fmt::format("[{}]:{}", options_.host, options_.port)
              : fmt::format("{}:{}", options_.host, options_.port);
  connect_with_retry();
}

Client::~Client() {
  if (fd_ >= 0) ::close(fd_);
}

void Client::fail(const std::string& reason) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  broken_reason_ = reason;
  throw StoreError(reason);
}

void Client::ensure_usable() const {
  if (fd_ < 0) {
    throw StoreError(fmt::format("connection to store at {} is closed after an earlier error: {}",
                                 peer_, broken_reason_));
  }
}

int Client::connect_once(Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(options_.port);
  const int gai = ::getaddrinfo(options_.host.c_str(), port.c_str(), &hints, &res);
  if (gai != 0) throw StoreError(fmt::format("cannot resolve {}: {}", peer_, gai_strerror(gai)));
  std::string errors;
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    int s =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (s < 0) {
      errors += fmt::format("{}socket: {}", errors.empty() ? "" : "; ", errno_text(errno));
      continue;
    }
    int err = 0;
    if (::connect(s, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{s, POLLOUT, 0};
        const int r = ::poll(&p, 1, remaining_ms(deadline));
        if (r == 0) {
          err = ETIMEDOUT;
        } else {
          socklen_t len = sizeof(err);
          ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
        }
      }
    }
    if (err != 0) {
      errors += fmt::format("{}{}", errors.empty() ? "" : "; ", errno_text(err));
      ::close(s);
      continue;
    }
    int one = 1;
    ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fd = s;
  }
  ::freeaddrinfo(res);
  if (fd < 0) throw StoreError(errors.empty() ? std::string("no address") : errors);
  return fd;
}

void Client::handshake(Clock::time_point deadline) {
  // VALIDATE and PING in one write; any failure from here on is the listener's: it accepted
  // the connection, so it is there, but it is not a store.
  std::string bytes;
  Request validate;
  validate.type = QueryType::kValidate;
  validate.u32 = kValidationMagic;
  encode_request(validate, bytes);
  Request ping;
  ping.type = QueryType::kPing;
  ping.u32 = static_cast<uint32_t>(::getpid());
  encode_request(ping, bytes);
  std::string echo(4, '\0');
  const auto sent_at = Clock::now();
  try {
    send_all(bytes, deadline);
    read_exact(echo.data(), echo.size(), deadline);
  } catch (const StoreTimeout&) {
    // Silence is evidence only when there was time to answer (an attempt can start at the
    // end of the connect loop's deadline).
    if (elapsed_ms(sent_at) < kMinPingWaitMs) throw;
    throw NotAStoreError(peer_, fmt::format("no answer to PING within {} ms", elapsed_ms(sent_at)));
  } catch (const StoreError& e) {
    // An end of file, or a reset (it closed before our bytes came): "... failed: <strerror>".
    const std::string what = e.what();
    const std::size_t os = what.find("failed: ");
    throw NotAStoreError(
        peer_, fmt::format("it closed the connection without answering PING{}",
                           os == std::string::npos ? std::string()
                                                   : fmt::format(" ({})", what.substr(os + 8))));
  }
  if (echo == bytes.substr(bytes.size() - 4)) return;  // PING's nonce, as encoded
  // Show what it sent: the 4 bytes and whatever else is already there (an HTTP status line).
  char more[60];
  const ssize_t n = ::recv(fd_, more, sizeof more, MSG_DONTWAIT);
  if (n > 0) echo.append(more, static_cast<std::size_t>(n));
  throw NotAStoreError(peer_, fmt::format("it answered PING with {}", printable(echo, 72)));
}

void Client::ping_locked(Clock::time_point deadline) {
  Request ping;
  ping.type = QueryType::kPing;
  ping.u32 = static_cast<uint32_t>(::getpid());
  const uint32_t echo = request(ping, deadline).u32();
  if (echo != ping.u32) {
    throw StoreError(fmt::format("store at {} answered PING {} with {}: not a TCPStore server?",
                                 peer_, ping.u32, echo));
  }
}

void Client::connect_with_retry() {
  const auto start = Clock::now();
  const auto deadline = start + options_.timeout;
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(-options_.connect_backoff_jitter,
                                                options_.connect_backoff_jitter);
  double delay_ms = static_cast<double>(options_.connect_backoff_initial.count());
  int attempts = 0;
  std::string last_error;
  std::optional<NotAStoreError> foreign;  // the last attempt reached a listener, not a store
  for (;;) {
    ++attempts;
    try {
      fd_ = connect_once(deadline);
      handshake(deadline);
      return;
    } catch (const NotAStoreError& e) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
      last_error = e.what();
      foreign = e;
    } catch (const StoreError& e) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
      last_error = e.what();
      foreign.reset();
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    auto sleep = std::chrono::milliseconds(
        static_cast<int64_t>(std::max(0.0, delay_ms * (1.0 + jitter(rng)))));
    sleep = std::min(sleep, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
    std::this_thread::sleep_for(sleep);
    // No attempt without time to answer: its PING would time out at once, and a listener that
    // is not a store would read as one that is slow.
    if (deadline - Clock::now() < std::chrono::milliseconds(kMinPingWaitMs)) break;
    delay_ms = std::min(delay_ms * options_.connect_backoff_factor,
                        static_cast<double>(options_.connect_backoff_max.count()));
  }
  broken_reason_ = fmt::format(
      "cannot connect to store at {}: {} attempt(s) over {} ms (timeout "
      "{} ms) failed; last error: {}",
      peer_, attempts, elapsed_ms(start), options_.timeout.count(), last_error);
  if (foreign) throw *foreign;
  throw StoreError(broken_reason_);
}

void Client::send_all(const std::string& bytes, Clock::time_point deadline) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      const int r = ::poll(&p, 1, remaining_ms(deadline));
      if (r == 0) {
        throw StoreTimeout(fmt::format("sending to store at {} timed out after {} ms", peer_,
                                       options_.timeout.count()));
      }
      continue;
    }
    throw StoreError(fmt::format("sending to store at {} failed: {}", peer_, errno_text(errno)));
  }
}

bool Client::read_byte_until(uint8_t& byte, Clock::time_point deadline) {
  for (;;) {
    const ssize_t n = ::recv(fd_, &byte, 1, 0);
    if (n == 1) return true;
    if (n == 0) throw StoreError(fmt::format("store at {} closed the connection", peer_));
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      throw StoreError(
          fmt::format("reading from store at {} failed: {}", peer_, errno_text(errno)));
    }
    pollfd p{fd_, POLLIN, 0};
    const int ms = remaining_ms(deadline);
    if (ms == 0) return false;
    if (::poll(&p, 1, ms) == 0) return false;
  }
}

void Client::read_exact(void* dst, std::size_t n, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(dst);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd_, p + got, n - got, 0);
    if (r > 0) {
      got += static_cast<std::size_t>(r);
      continue;
    }
    if (r == 0) {
      throw StoreError(fmt::format("store at {} closed the connection{}", peer_,
                                   got > 0 ? " in the middle of a reply" : ""));
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      throw StoreError(
          fmt::format("reading from store at {} failed: {}", peer_, errno_text(errno)));
    }
    pollfd pf{fd_, POLLIN, 0};
    const int ms = remaining_ms(deadline);
    if (ms == 0 || ::poll(&pf, 1, ms) == 0) {
      throw StoreTimeout(
          fmt::format("no reply from store at {} within {} ms", peer_, options_.timeout.count()));
    }
  }
}

ReplyReader Client::request(const Request& req, Clock::time_point deadline) {
  std::string bytes;
  encode_request(req, bytes);
  send_all(bytes, deadline);
  return ReplyReader([this, deadline](void* dst, std::size_t n) { read_exact(dst, n, deadline); },
                     options_.limits, peer_);
}

void Client::wait_locked(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  Request req;
  req.type = QueryType::kWait;
  req.keys = keys;
  std::string bytes;
  encode_request(req, bytes);
  send_all(bytes, op_deadline());
  uint8_t reply = 0;
  if (read_byte_until(reply, start + timeout)) {
    if (reply != kStopWaiting) {
      throw StoreError(
          fmt::format("store at {} answered WAIT with byte {}, expected 0", peer_, reply));
    }
    return;
  }
  // Timed out: cancel. A STOP_WAITING (0) may have crossed the cancel; then the
  // WAIT_CANCELED (1) follows it.
  Request cancel;
  cancel.type = QueryType::kCancelWait;
  auto reader = request(cancel, op_deadline());
  uint8_t b = reader.u8();
  if (b == kStopWaiting) b = reader.u8();
  if (b != kWaitCanceled) {
    throw StoreError(
        fmt::format("store at {} answered CANCEL_WAIT with byte {}, expected 1", peer_, b));
  }
  throw CleanWaitTimeout(
      fmt::format("wait for keys {} on store at {} timed out after {} ms "
                  "(timeout {} ms)",
                  key_list(keys), peer_, elapsed_ms(start), timeout.count()));
}

// Runs one operation under the mutex; a failure other than a cleanly cancelled
// wait closes the connection.
#define GPURUN_STORE_OP(...)                \
  std::lock_guard<std::mutex> lock(mutex_); \
  ensure_usable();                          \
  try {                                     \
    __VA_ARGS__                             \
  } catch (const CleanWaitTimeout&) {       \
    throw;                                  \
  } catch (const StoreTimeout& e) {         \
    if (fd_ >= 0) ::close(fd_);             \
    fd_ = -1;                               \
    broken_reason_ = e.what();              \
    throw;                                  \
  } catch (const StoreError& e) {           \
    fail(e.what());                         \
  }

void Client::set(std::string_view key, std::string_view value){GPURUN_STORE_OP({
  Request r;
  r.type = QueryType::kSet;
  r.keys = {std::string(key)};
  r.values = {std::string(value)};
  std::string bytes;
  encode_request(r, bytes);
  send_all(bytes, op_deadline());
})}

std::string Client::get(std::string_view key) {
  GPURUN_STORE_OP({
    Request r;
    r.type = QueryType::kGet;
    r.keys = {std::string(key)};
    wait_locked(r.keys, options_.timeout);
    return request(r, op_deadline()).bytes();
  })
  return {};
}

int64_t Client::add(std::string_view key, int64_t delta) {
  GPURUN_STORE_OP({
    Request r;
    r.type = QueryType::kAdd;
    r.keys = {std::string(key)};
    r.delta = delta;
    return request(r, op_deadline()).i64();
  })
  return 0;
}

std::string Client::compare_set(std::string_view key, std::string_view expected,
                                std::string_view desired) {
  GPURUN_STORE_OP({
    Request r;
    r.type = QueryType::kCompareSet;
    r.keys = {std::string(key)};
    r.values = {std::string(expected), std::string(desired)};
    return request(r, op_deadline()).bytes();
  })
  return {};
}

bool Client::check(const std::vector<std::string>& keys) {
  GPURUN_STORE_OP({
    Request r;
    r.type = QueryType::kCheck;
    r.keys = keys;
    const uint8_t b = request(r, op_deadline()).u8();
    if (b != kCheckReady && b != kCheckNotReady) {
      throw StoreError(fmt::format("store at {} answered CHECK with byte {}", peer_, b));
    }
    return b == kCheckReady;
  })
  return false;
}

void Client::wait(const std::vector<std::string>& keys) {
  wait(keys, options_.timeout);
}

void Client::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout){
    GPURUN_STORE_OP({ wait_locked(keys, timeout); })}

int64_t Client::num_keys() {
  GPURUN_STORE_OP({
    Request r;
    r.type = QueryType::kGetNumKeys;
    return request(r, op_deadline()).i64();
  })
  return 0;
}

bool Client::delete_key(std::string_view key) {
  GPURUN_STORE_OP({
    Request r;
    r.type = QueryType::kDeleteKey;
    r.keys = {std::string(key)};
    return request(r, op_deadline()).i64() != 0;
  })
  return false;
}

void Client::append(std::string_view key, std::string_view value){GPURUN_STORE_OP({
  Request r;
  r.type = QueryType::kAppend;
  r.keys = {std::string(key)};
  r.values = {std::string(value)};
  std::string bytes;
  encode_request(r, bytes);
  send_all(bytes, op_deadline());
})}

std::vector<std::string> Client::multi_get(const std::vector<std::string>& keys) {
  GPURUN_STORE_OP({
    wait_locked(keys, options_.timeout);
    Request r;
    r.type = QueryType::kMultiGet;
    r.keys = keys;
    return request(r, op_deadline()).byte_list(keys.size());
  })
  return {};
}

void Client::multi_set(const std::vector<std::string>& keys,
                       const std::vector<std::string>& values) {
  GPURUN_CHECK(keys.size() == values.size(), "multi_set with {} keys and {} values", keys.size(),
               values.size());
  GPURUN_STORE_OP({
    Request r;
    r.type = QueryType::kMultiSet;
    r.keys = keys;
    r.values = values;
    std::string bytes;
    encode_request(r, bytes);
    send_all(bytes, op_deadline());
  })
}

void Client::queue_push(std::string_view key, std::string_view value){GPURUN_STORE_OP({
  Request r;
  r.type = QueryType::kQueuePush;
  r.keys = {std::string(key)};
  r.values = {std::string(value)};
  std::string bytes;
  encode_request(r, bytes);
  send_all(bytes, op_deadline());
})}

std::optional<std::string> Client::queue_pop(std::string_view key, bool block) {
  GPURUN_STORE_OP({
    Request r;
    r.type = QueryType::kQueuePop;
    r.keys = {std::string(key)};
    const auto deadline = op_deadline();
    for (;;) {
      if (block) {
        // Another client may pop between our WAIT and POP: wait again with what is left.
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        wait_locked(r.keys, std::max(left, std::chrono::milliseconds(0)));
      }
      auto reader = request(r, op_deadline());
      const int64_t len = reader.i64();
      if (len < 0)
        throw StoreError(fmt::format("store at {} answered QUEUE_POP with {}", peer_, len));
      if (len > 0) return std::optional<std::string>(reader.bytes());
      if (!block) return std::optional<std::string>();
    }
  })
  return std::nullopt;
}

int64_t Client::queue_len(std::string_view key) {
  GPURUN_STORE_OP({
    Request r;
    r.type = QueryType::kQueueLen;
    r.keys = {std::string(key)};
    return request(r, op_deadline()).i64();
  })
  return 0;
}

std::vector<std::string> Client::list_keys() {
  GPURUN_STORE_OP({
    Request r;
    r.type = QueryType::kListKeys;
    auto reader = request(r, op_deadline());
    const int64_t n = reader.i64();
    if (n < 0)
      throw StoreError(fmt::format("store at {} answered LIST_KEYS with {} keys", peer_, n));
    return reader.byte_list(static_cast<uint64_t>(n));
  })
  return {};
}

void Client::ping() {
  GPURUN_STORE_OP({ ping_locked(op_deadline()); })
}

#undef GPURUN_STORE_OP

}  // namespace gpurun::store
