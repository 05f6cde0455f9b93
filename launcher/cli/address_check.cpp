// check_master_addr (launcher/cli/cli.hpp): whether --master-addr resolves, with a bounded wait.
#include <arpa/inet.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/cli.hpp"
#include "gpurun/sanitizers.hpp"

namespace gpurun::supervisor {
namespace {
/// The numeric addresses of `list`, in order, without duplicates (IPv6 with "%scope" when set).
std::vector<std::string> numeric_addresses(const addrinfo* list) {
  std::vector<std::string> out;
  for (const addrinfo* a = list; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    std::string addr;
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) addr = text;
    } else if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      if (::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text)) addr = text;
      char name[IF_NAMESIZE] = {};
      if (!addr.empty() && in6->sin6_scope_id != 0 && ::if_indextoname(in6->sin6_scope_id, name))
        addr += std::string("%") + name;
    }
    if (!addr.empty() && std::find(out.begin(), out.end(), addr) == out.end()) out.push_back(addr);
  }
  return out;
}

/// getaddrinfo's answer for the name `host` within `timeout`: 0 (with `addresses` filled), an
/// EAI_* code, or EAI_AGAIN with `timed_out` set. getaddrinfo_a runs the lookup on glibc's own
/// thread; a lookup that does not answer in time is cancelled (or, when glibc cannot cancel it,
/// left to finish on its own: its request block is then deliberately not freed).
int lookup(const std::string& host, std::chrono::milliseconds timeout, bool& timed_out,
           std::vector<std::string>& addresses) {
#ifdef GPURUN_TSAN
  // ThreadSanitizer (scripts/tsan.sh) cannot run getaddrinfo_a: glibc starts its lookup thread
  // without the pthread_create that TSan intercepts, and that thread then crashes in TSan's
  // malloc. Under TSan only, the lookup blocks in getaddrinfo, without the timeout.
  (void)timeout;
  (void)timed_out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &list);
  if (rc == 0) addresses = numeric_addresses(list);
  if (list) ::freeaddrinfo(list);
  return rc;
#else
  struct Request {
    std::string host;
    addrinfo hints{};
    gaicb cb{};
  };
  auto* req = new Request;
  req->host = host;
  req->hints.ai_family = AF_UNSPEC;
  req->hints.ai_socktype = SOCK_STREAM;
  req->hints.ai_flags = 0;  // no AI_ADDRCONFIG: a loopback-only host still resolves ::1
  req->cb.ar_name = req->host.c_str();
  req->cb.ar_request = &req->hints;
  gaicb* list[] = {&req->cb};
  if (const int rc = ::getaddrinfo_a(GAI_NOWAIT, list, 1, nullptr); rc != 0) {
    delete req;
    return rc;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (::gai_error(&req->cb) == EAI_INPROGRESS) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) break;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    const timespec wait{static_cast<time_t>(ns / 1'000'000'000),
                        static_cast<long>(ns % 1'000'000'000)};
    const gaicb* const waiting[] = {&req->cb};
    ::gai_suspend(waiting, 1, &wait);  // EAI_AGAIN (timeout), EAI_INTR or done: re-check
  }
  if (::gai_error(&req->cb) == EAI_INPROGRESS) {
    const int cancel = ::gai_cancel(&req->cb);
    if (cancel != EAI_ALLDONE) {  // it answered just now: use the answer
      timed_out = true;
      if (cancel == EAI_CANCELED) delete req;  // else glibc still holds it
      return EAI_AGAIN;
    }
  }
  const int rc = ::gai_error(&req->cb);
  if (rc == 0) addresses = numeric_addresses(req->cb.ar_result);
  if (req->cb.ar_result) ::freeaddrinfo(req->cb.ar_result);
  delete req;
  return rc;
#endif
}

/// True when `host` is in the .invalid domain, which never resolves (RFC 6761 6.4: resolvers
/// answer it at once, without asking DNS).
bool invalid_domain(std::string_view host) {
  while (!host.empty() && host.back() == '.') host.remove_suffix(1);
  constexpr std::string_view kInvalid = "invalid";
  if (host.size() < kInvalid.size()) return false;
  const std::string_view tail = host.substr(host.size() - kInvalid.size());
  for (std::size_t i = 0; i < tail.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(tail[i])) != kInvalid[i]) return false;
  return host.size() == kInvalid.size() || host[host.size() - kInvalid.size() - 1] == '.';
}
}  // namespace

AddressCheck check_master_addr(const std::string& addr, std::chrono::milliseconds timeout) {
  AddressCheck out;
  std::string host = addr;
  const bool bracketed = host.size() >= 2 && host.front() == '[' && host.back() == ']';
  if (bracketed) host = host.substr(1, host.size() - 2);
  // A literal needs no lookup: numeric first (no DNS, no /etc/hosts, never blocks).
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* numeric = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &numeric) == 0) {
    ::freeaddrinfo(numeric);
    if (!bracketed || host.find(':') != std::string::npos) {
      out.addresses = {host};
      return out;
    }
  }
  if (bracketed || host.find_first_of("[]") != std::string::npos) {
    out.result = AddressCheck::Result::kUnresolvable;
    out.reason = "brackets enclose only an IPv6 address, e.g. [::1]";
    return out;
  }
  if (invalid_domain(host)) {
    out.result = AddressCheck::Result::kUnresolvable;
    out.reason = ::gai_strerror(EAI_NONAME);
    return out;
  }
  bool timed_out = false;
  const int rc = lookup(host, timeout, timed_out, out.addresses);
  if (rc == 0) return out;
  out.result = timed_out ? AddressCheck::Result::kTimedOut : AddressCheck::Result::kUnresolvable;
  out.reason = timed_out ? fmt::format("no answer within {} ms", timeout.count())
                         : std::string(::gai_strerror(rc));
  return out;
}

}  // namespace gpurun::supervisor
