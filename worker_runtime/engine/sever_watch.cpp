#include "gpurun/worker/sever_watch.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "gpurun/control/keys.hpp"
#include "gpurun/error.hpp"

namespace gpurun::control {

namespace {

// The address as the 16 bytes of an IPv6 one (IPv4 mapped: ::ffff:a.b.c.d).
std::optional<in6_addr> parse_address(const std::string& address) {
  in6_addr a6{};
  if (::inet_pton(AF_INET6, address.c_str(), &a6) == 1) return a6;
  in_addr a4{};
  if (::inet_pton(AF_INET, address.c_str(), &a4) != 1) return std::nullopt;
  a6.s6_addr[10] = 0xff;
  a6.s6_addr[11] = 0xff;
  std::memcpy(&a6.s6_addr[12], &a4.s_addr, 4);
  return a6;
}

// /proc/self/fd: socket inode -> fd.
std::map<unsigned long, int> socket_fds() {
  std::map<unsigned long, int> out;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return out;
  while (const dirent* e = ::readdir(d)) {
    char target[64] = {};
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
    unsigned long inode = 0;
    if (n > 0 && std::sscanf(target, "socket:[%lu]", &inode) == 1)
      out[inode] = std::atoi(e->d_name);
  }
  ::closedir(d);
  return out;
}

// One row of /proc/self/net/tcp{,6}: the remote address (16 bytes, v4 mapped), the state, the
// inode. The kernel prints each 32-bit word of the address as %08X of its in-memory value.
struct Row {
  in6_addr remote{};
  unsigned state = 0;
  unsigned long inode = 0;
};

std::optional<Row> parse_row(const std::string& line, bool v6) {
  std::istringstream in(line);
  std::string sl, local, remote, state, queues, timer, retr, uid, timeout;
  unsigned long inode = 0;
  if (!(in >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode))
    return std::nullopt;
  const std::size_t colon = remote.find(':');
  if (colon != (v6 ? 32u : 8u)) return std::nullopt;
  Row r;
  r.inode = inode;
  r.state = static_cast<unsigned>(std::strtoul(state.c_str(), nullptr, 16));
  uint32_t words[4] = {};
  const int n = v6 ? 4 : 1;
  for (int i = 0; i < n; ++i)
    words[i] = static_cast<uint32_t>(std::strtoul(remote.substr(i * 8, 8).c_str(), nullptr, 16));
  if (v6) {
    std::memcpy(r.remote.s6_addr, words, 16);
  } else {
    r.remote.s6_addr[10] = 0xff;
    r.remote.s6_addr[11] = 0xff;
    std::memcpy(&r.remote.s6_addr[12], &words[0], 4);
  }
  return r;
}

constexpr unsigned kListen = 0x0A;  // TCP_LISTEN in /proc/net/tcp

}  // namespace

int sever_connections(const std::string& address) {
  const std::optional<in6_addr> target = parse_address(address);
  if (!target) return 0;
  const std::map<unsigned long, int> fds = socket_fds();
  int severed = 0;
  for (const bool v6 : {false, true}) {
    std::ifstream f(v6 ? "/proc/self/net/tcp6" : "/proc/self/net/tcp");
    std::string line;
    std::getline(f, line);  // the header
    while (std::getline(f, line)) {
      const std::optional<Row> r = parse_row(line, v6);
      if (!r || r->state == kListen || r->inode == 0) continue;
      if (std::memcmp(r->remote.s6_addr, target->s6_addr, 16) != 0) continue;
      const auto fd = fds.find(r->inode);
      if (fd == fds.end()) continue;  // another process's
      if (::shutdown(fd->second, SHUT_RDWR) == 0) ++severed;
    }
  }
  return severed;
}

bool local_address(const std::string& address) {
  const std::optional<in6_addr> target = parse_address(address);
  if (!target) return false;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  bool found = false;
  for (const ifaddrs* i = list; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    in6_addr a{};
    if (i->ifa_addr->sa_family == AF_INET) {
      a.s6_addr[10] = 0xff;
      a.s6_addr[11] = 0xff;
      std::memcpy(&a.s6_addr[12], &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, 4);
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      a = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr;
    } else {
      continue;
    }
    found = std::memcmp(a.s6_addr, target->s6_addr, 16) == 0;
  }
  ::freeifaddrs(list);
  return found;
}

bool same_address(const std::string& address, const std::string& host) {
  const std::optional<in6_addr> target = parse_address(address);
  if (!target || host.empty()) return false;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  // "[::1]" (the URL form of --master-addr) is the address ::1.
  const std::string name = host.size() > 2 && host.front() == '[' && host.back() == ']'
                               ? host.substr(1, host.size() - 2)
                               : host;
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &list) != 0) return false;
  bool found = false;
  for (const addrinfo* i = list; i && !found; i = i->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* a =
        i->ai_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(i->ai_addr)->sin_addr)
            : static_cast<const void*>(
                  &reinterpret_cast<const sockaddr_in6*>(i->ai_addr)->sin6_addr);
    if (::inet_ntop(i->ai_family, a, text, sizeof text) == nullptr) continue;
    const std::optional<in6_addr> r = parse_address(text);
    found = r && std::memcmp(r->s6_addr, target->s6_addr, 16) == 0;
  }
  ::freeaddrinfo(list);
  return found;
}

SeverWatch::SeverWatch(std::unique_ptr<store::Store> store, SeverWatchOptions options)
    : store_(std::move(store)), opt_(std::move(options)) {
  thread_ = std::thread([this] { run(); });
}

SeverWatch::~SeverWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool SeverWatch::pause(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, d, [this] { return stop_; });
}

void SeverWatch::run() {
  try {
    if (!store_->try_get(keys::node_job())) {  // one node: nobody to sever
      store_.reset();                          // nor a connection to hold
      return;
    }
    while (pause(opt_.poll)) {
      const int64_t mine = opt_.generation ? opt_.generation() : -1;
      if (mine < 0) continue;  // no generation yet: its entries wait
      while (const std::optional<std::string> v = store_->try_get(keys::sever(next_.load()))) {
        ++next_;
        const std::optional<keys::Sever> s = keys::parse_sever(*v);
        if (!s || s->generation < mine || opt_.local(s->address) ||
            same_address(s->address, opt_.store_host))
          continue;
        const int n = opt_.sever(s->address);
        if (opt_.log)
          opt_.log(fmt::format(
              "node 0 gave up the node at {} (generation {}): shut down {} connection(s) of this "
              "process to it, so that a collective waiting on its workers fails now",
              s->address, s->generation, n));
      }
    }
  } catch (const gpurun::Error&) {
    // The store is gone or unreachable: the session's own requests report it.
    store_.reset();
  }
}

}  // namespace gpurun::control
