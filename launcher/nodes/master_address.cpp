#include "nodes/master_address.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "gpurun/error.hpp"

namespace gpurun::supervisor {
namespace {

/// A numeric address: family AF_INET (4 bytes used) or AF_INET6, and the IPv6 scope if given.
struct Ip {
  int family = 0;
  std::array<unsigned char, 16> bytes{};
  std::string scope;
  bool operator==(const Ip& o) const { return family == o.family && bytes == o.bytes; }
};

std::optional<Ip> parse_ip(const std::string& text) {
  Ip ip;
  std::string host = text;
  if (const auto pct = host.find('%'); pct != std::string::npos) {
    ip.scope = host.substr(pct + 1);
    host.resize(pct);
  }
  if (ip.scope.empty() && ::inet_pton(AF_INET, host.c_str(), ip.bytes.data()) == 1) {
    ip.family = AF_INET;
    return ip;
  }
  if (::inet_pton(AF_INET6, host.c_str(), ip.bytes.data()) != 1) return std::nullopt;
  ip.family = AF_INET6;
  static constexpr std::array<unsigned char, 12> kMapped{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::equal(kMapped.begin(), kMapped.end(), ip.bytes.begin())) {  // ::ffff:a.b.c.d
    std::memmove(ip.bytes.data(), ip.bytes.data() + 12, 4);
    std::fill(ip.bytes.begin() + 4, ip.bytes.end(), 0);
    ip.family = AF_INET;
    ip.scope.clear();
  }
  return ip;
}

bool all_zero(const Ip& ip, std::size_t n) {
  return std::all_of(ip.bytes.begin(), ip.bytes.begin() + static_cast<std::ptrdiff_t>(n),
                     [](unsigned char c) { return c == 0; });
}

bool is_loopback(const Ip& ip) {
  if (ip.family == AF_INET) return ip.bytes[0] == 127;
  return all_zero(ip, 15) && ip.bytes[15] == 1;
}

bool is_wildcard(const Ip& ip) {
  return all_zero(ip, ip.family == AF_INET ? 4 : 16);
}

bool is_link_local_v6(const Ip& ip) {
  return ip.family == AF_INET6 && ip.bytes[0] == 0xfe && (ip.bytes[1] & 0xc0) == 0x80;
}

}  // namespace

std::vector<InterfaceAddress> interface_addresses() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) {
    const int err = errno;
    throw Error(
        fmt::format("cannot list this host's addresses: getifaddrs: {}", std::strerror(err)));
  }
  std::vector<InterfaceAddress> out;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw = nullptr;
    if (i->ifa_addr->sa_family == AF_INET)
      raw = &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr;
    else if (i->ifa_addr->sa_family == AF_INET6)
      raw = &reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr;
    else
      continue;
    if (::inet_ntop(i->ifa_addr->sa_family, raw, text, sizeof text) == nullptr) continue;
    out.push_back(InterfaceAddress{i->ifa_name ? i->ifa_name : "", text});
  }
  ::freeifaddrs(list);
  return out;
}

std::vector<std::string> local_addresses(const std::vector<std::string>& resolved,
                                         const std::vector<InterfaceAddress>& interfaces) {
  std::vector<std::string> out;
  std::vector<Ip> seen;
  for (const std::string& text : resolved) {
    const std::optional<Ip> ip = parse_ip(text);
    if (!ip || std::find(seen.begin(), seen.end(), *ip) != seen.end()) continue;
    std::string listen_as = text;
    bool local = is_loopback(*ip) || is_wildcard(*ip);
    for (const InterfaceAddress& itf : interfaces) {
      if (local) break;
      const std::optional<Ip> mine = parse_ip(itf.address);
      if (!mine || !(*mine == *ip)) continue;
      local = true;
      if (is_link_local_v6(*ip) && ip->scope.empty())
        listen_as = fmt::format("{}%{}", text, itf.interface);
    }
    if (!local) continue;
    seen.push_back(*ip);
    out.push_back(listen_as);
  }
  return out;
}

std::string not_this_host_reason(const std::string& given, const std::vector<std::string>& resolved,
                                 const std::vector<InterfaceAddress>& interfaces) {
  // "lo: 127.0.0.1, ::1; eth0: 10.0.0.5", interfaces in first-seen order.
  std::vector<std::pair<std::string, std::vector<std::string>>> by_interface;
  std::size_t listed = 0;
  constexpr std::size_t kMaxListed = 12;
  for (const InterfaceAddress& itf : interfaces) {
    if (listed == kMaxListed) break;
    auto it = std::find_if(by_interface.begin(), by_interface.end(),
                           [&](const auto& e) { return e.first == itf.interface; });
    if (it == by_interface.end()) it = by_interface.insert(by_interface.end(), {itf.interface, {}});
    it->second.push_back(itf.address);
    ++listed;
  }
  std::vector<std::string> parts;
  for (const auto& [name, addrs] : by_interface)
    parts.push_back(fmt::format("{}: {}", name, fmt::join(addrs, ", ")));
  std::string mine =
      parts.empty() ? std::string("none found") : fmt::format("{}", fmt::join(parts, "; "));
  if (listed < interfaces.size()) mine += fmt::format("; {} more", interfaces.size() - listed);
  std::string what;
  if (resolved.size() == 1 && resolved.front() == given)
    what = fmt::format("{} is not an address", given);
  else if (resolved.size() == 1)
    what = fmt::format("it resolves to {}, which is not an address", resolved.front());
  else
    what = fmt::format("it resolves to {}, none of them an address", fmt::join(resolved, ", "));
  return fmt::format(
      "node 0 hosts the store, but {} of this host ({}); start node 0 (--node-rank 0) on the "
      "host this address names, or give one of this host's addresses",
      what, mine);
}

std::vector<std::string> store_listen_hosts(int nnodes, const std::vector<std::string>& local) {
  if (nnodes > 1) return {"::"};
  const bool loopback_only = std::all_of(local.begin(), local.end(), [](const std::string& a) {
    return a == "127.0.0.1" || a == "::1";
  });
  if (loopback_only) return {"127.0.0.1", "::1"};
  std::vector<std::string> hosts;
  for (const std::string& a : local)
    if (a.find(':') == std::string::npos) hosts.push_back(a);
  for (const std::string& a : local)
    if (a.find(':') != std::string::npos) hosts.push_back(a);
  return hosts;
}

bool may_take_free_port(int nnodes, bool port_given, bool master_port_env) {
  return nnodes == 1 && !port_given && !master_port_env;
}

std::string free_port_note(uint16_t asked, const std::string& host, uint16_t bound) {
  const std::string where = host.find(':') != std::string::npos
                                ? fmt::format("[{}]:{}", host, bound)
                                : fmt::format("{}:{}", host, bound);
  return fmt::format(
      "port {} is busy; the store listens on {} instead (give --master-port to choose)", asked,
      where);
}

bool port_in_use(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  const bool in_use =
      ::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 && errno == EADDRINUSE;
  ::close(fd);
  return in_use;
}

}  // namespace gpurun::supervisor
