// Static multi-node on loopback with LibTorch workers: two real gpurun processes (--nnodes 2,
// 2 CPU workers each) whose workers all-reduce (rank + 1) through the worker runtime's Gloo
// communicator across the two "nodes". Every rank must print 1+2+3+4 = 10 and both gpuruns
// exit 0, for IPv4, IPv6 (bare and bracketed) and host-name master addresses, which reach the
// workers verbatim (MASTER_ADDR). (Node 0's store outliving node 1's slower workers is
// tests/supervisor/multinode_test.cpp.)
#include <doctest/doctest.h>

#include "gpurun_process.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

const std::string kGpurun = GPURUN_BINARY;
const std::string kWorker = GPURUN_ALLREDUCE_WORKER;

using gpurun::testing::ChildProcess;
using gpurun::testing::free_port;
using gpurun::testing::TempDir;

/// One of this host's non-loopback IPv4 addresses ("" when none).
std::string non_loopback_ipv4() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string own;
  for (ifaddrs* i = list; i && own.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    if (std::string(text).rfind("127.", 0) != 0) own = text;
  }
  ::freeifaddrs(list);
  return own;
}

/// gpurun for node `rank` of 2 with two CPU workers running allreduce_worker.
struct Node : ChildProcess {
  Node(int rank, const std::string& addr, const std::string& port, const fs::path& dir)
      : ChildProcess({kGpurun, "--nnodes", "2", "--node-rank", std::to_string(rank),
                      "--master-addr", addr, "--master-port", port, "--nproc", "2", "--device",
                      "cpu", "--grace-period", "2", kWorker},
                     // A broken rendezvous fails in 60 s, not the runtime's default 300 s.
                     {{"GPURUN_COMM_TIMEOUT_MS", "60000"}},
                     dir / ("node" + std::to_string(rank) + ".stdout"),
                     dir / ("node" + std::to_string(rank) + ".stderr")) {}
};

/// The line rank `rank` printed, from its node's stdout ("" when none).
std::string line_of(const std::string& out, int rank) {
  const std::string key = "allreduce rank=" + std::to_string(rank) + " ";
  const auto at = out.find(key);
  if (at == std::string::npos) return "";
  return out.substr(at, out.find('\n', at) - at);
}

}  // namespace

TEST_CASE("multinode allreduce: 2 nodes x 2 CPU workers sum rank+1 over Gloo to 10 on every rank") {
  std::vector<std::string> addrs{"127.0.0.1", "::1", "[::1]", "localhost"};
  // This host's non-loopback address, when it has one: the Gloo devices then listen there
  // (the route to the master), as on a real cluster, not on 127.0.0.1.
  if (const std::string own = non_loopback_ipv4(); !own.empty()) addrs.push_back(own);
  for (const std::string& addr : addrs) {
    CAPTURE(addr);
    TempDir dir;
    const std::string port = free_port();
    Node n0(0, addr, port, dir.path);
    Node n1(1, addr, port, dir.path);
    const bool n1_done = n1.wait(90s);
    const bool n0_done = n0.wait(20s);
    const std::string out0 = n0.stdout_text(), out1 = n1.stdout_text();
    INFO("node 0 stdout:\n" << out0 << "node 0 stderr:\n" << n0.stderr_text());
    INFO("node 1 stdout:\n" << out1 << "node 1 stderr:\n" << n1.stderr_text());
    REQUIRE(n0_done);
    REQUIRE(n1_done);
    CHECK(n0.code() == 0);
    CHECK(n1.code() == 0);
    // Global rank = node rank x nproc + local rank: node 0 has ranks 0-1, node 1 ranks 2-3.
    for (int rank = 0; rank < 4; ++rank) {
      CAPTURE(rank);
      const int node = rank / 2;
      CHECK(line_of(node == 0 ? out0 : out1, rank) == "allreduce rank=" + std::to_string(rank) +
                                                          " world=4 node=" + std::to_string(node) +
                                                          " master=" + addr + " sum=10");
      CHECK(line_of(node == 0 ? out1 : out0, rank).empty());
    }
  }
}
