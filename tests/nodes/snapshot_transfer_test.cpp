// The pause snapshot's copy between the nodes of an elastic job (docs/cli.md#elastic-nodes,
// "Pause and resume across nodes"): a SnapshotServer on an io thread, fetch_snapshot over
// 127.0.0.1. The whole resume across nodes: tests/python/run_nodes_pause.sh.
#include "nodes/snapshot_transfer.hpp"

#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include "gpurun/error.hpp"
#include "gpurun/unique_fd.hpp"

namespace gpurun::supervisor {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string random_bytes(std::size_t n) {
  std::mt19937_64 rng(46);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

/// A temporary directory, removed at the end.
struct TempDir {
  TempDir() {
    path = fs::temp_directory_path() / ("gpurun-snapshot-transfer-" + std::to_string(::getpid()) +
                                        "-" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
  /// The files in it (names), sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  fs::path path;
};

/// A SnapshotServer for run "job-a" serving `dir`/node.snapshot, on an io thread of its own.
struct Served {
  explicit Served(const TempDir& dir, SnapshotServerOptions o = {}) : work(io.get_executor()) {
    o.address = "127.0.0.1";
    if (o.run_id.empty()) o.run_id = "job-a";
    const std::string file = (dir.path / "node.snapshot").string();
    if (!o.files) o.files = [file] { return std::vector<std::string>{file}; };
    o.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu);
      lines.push_back(line);
    };
    server = std::make_unique<SnapshotServer>(io, std::move(o));
    thread = std::thread([this] { io.run(); });
  }
  ~Served() {
    boost::asio::post(io, [this] { server->close(); });
    work.reset();
    io.stop();
    thread.join();
  }
  std::string endpoint() const { return server->endpoint("127.0.0.1"); }
  std::string log() {
    std::lock_guard<std::mutex> lock(mu);
    std::string all;
    for (const auto& l : lines) all += l + "\n";
    return all;
  }
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work;
  std::unique_ptr<SnapshotServer> server;
  std::thread thread;
  std::mutex mu;
  std::vector<std::string> lines;
};

/// What fetch_snapshot threw ("" when it did not).
std::string fetch_error(const std::string& endpoint, const std::string& run_id,
                        const fs::path& dest) {
  try {
    fetch_snapshot(endpoint, run_id, dest.string(), 5s);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

TEST_CASE("a fetch copies the serving node's snapshot byte for byte and says how much") {
  TempDir from, to;
  const std::string bytes = random_bytes((20u << 20) + 12345);  // several sendfile chunks
  write_file(from.path / "node.snapshot", bytes);
  write_file(to.path / "mine.snapshot", "an older snapshot of this node");
  Served s(from);
  const SnapshotFetched f =
      fetch_snapshot(s.endpoint(), "job-a", (to.path / "mine.snapshot").string(), 5s);
  CHECK(f.bytes == static_cast<int64_t>(bytes.size()));
  CHECK(f.ms >= 0);
  CHECK(read_file(to.path / "mine.snapshot") == bytes);
  CHECK(to.names() == std::vector<std::string>{"mine.snapshot"});  // no temporary file left
}

TEST_CASE("a request for another job is refused and leaves no file") {
  TempDir from, to;
  write_file(from.path / "node.snapshot", "state");
  Served s(from);
  const std::string err = fetch_error(s.endpoint(), "job-b", to.path / "mine.snapshot");
  INFO(err);
  CHECK(err.find("copying the pause snapshot from " + s.endpoint()) != std::string::npos);
  CHECK(err.find("this node serves job 'job-a', not 'job-b'") != std::string::npos);
  CHECK(to.names().empty());
}

TEST_CASE("a node without a snapshot says so, naming the paths it looked at") {
  TempDir from, to;
  Served s(from);
  const std::string err = fetch_error(s.endpoint(), "job-a", to.path / "mine.snapshot");
  INFO(err);
  CHECK(err.find("this node has no pause snapshot") != std::string::npos);
  CHECK(err.find((from.path / "node.snapshot").string()) != std::string::npos);
  CHECK(err.find("No such file or directory") != std::string::npos);
  CHECK(to.names().empty());
}

TEST_CASE("a server that closes mid-stream: the fetch fails, the old file at dest stays whole") {
  TempDir to;
  write_file(to.path / "mine.snapshot", "the old one");
  // A raw server: says 1000000 bytes, sends 1000 and closes.
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(listener);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(listener.get(), 1) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const std::string endpoint = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  std::thread server([&listener] {
    UniqueFd c(::accept(listener.get(), nullptr, nullptr));
    if (!c) return;
    char req[256];
    (void)!::recv(c.get(), req, sizeof req, 0);
    const std::string reply = "OK 1000000\n" + std::string(1000, 'x');
    (void)!::send(c.get(), reply.data(), reply.size(), MSG_NOSIGNAL);
  });
  const std::string err = fetch_error(endpoint, "job-a", to.path / "mine.snapshot");
  server.join();
  INFO(err);
  CHECK(err.find("failed after 1000 of 1000000 bytes: the server closed the connection") !=
        std::string::npos);
  CHECK(read_file(to.path / "mine.snapshot") == "the old one");
  CHECK(to.names() == std::vector<std::string>{"mine.snapshot"});
}

TEST_CASE("nobody serving at the endpoint: the fetch fails naming it") {
  TempDir to;
  std::string endpoint;
  {
    TempDir from;
    Served s(from);
    endpoint = s.endpoint();
  }  // closed: nothing listens there now
  const std::string err = fetch_error(endpoint, "job-a", to.path / "mine.snapshot");
  INFO(err);
  CHECK(err.find("from " + endpoint) != std::string::npos);
  CHECK(err.find("cannot connect") != std::string::npos);
  CHECK(to.names().empty());
}

TEST_CASE("a client that sends no request loses its connection; another is served meanwhile") {
  TempDir from, to;
  write_file(from.path / "node.snapshot", "state bytes");
  SnapshotServerOptions o;
  o.request_timeout = 200ms;
  Served s(from, o);
  UniqueFd silent(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(s.server->port());
  REQUIRE(::connect(silent.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  // Served while the silent one holds its connection.
  fetch_snapshot(s.endpoint(), "job-a", (to.path / "mine.snapshot").string(), 5s);
  CHECK(read_file(to.path / "mine.snapshot") == "state bytes");
  char c;
  CHECK(::recv(silent.get(), &c, 1, 0) == 0);  // closed by the server after 200 ms
  CHECK(s.log().find("sent no request for 200 ms: closing its connection") != std::string::npos);
}

TEST_CASE("SnapshotFetcher: the copy lands at the first path, a stale one at the other goes") {
  TempDir from, to;
  write_file(from.path / "node.snapshot", "the pause state");
  write_file(to.path / "fallback.snapshot", "a stale snapshot");
  Served s(from);
  const std::vector<std::string> files = {(to.path / "shm.snapshot").string(),
                                          (to.path / "fallback.snapshot").string()};
  std::promise<control::NodeEvent> got;
  {
    SnapshotFetcher fetcher("job-a", [files] { return files; });
    fetcher.start(s.endpoint(), 7, [&got](const control::NodeEvent& e) { got.set_value(e); });
    const control::NodeEvent e = got.get_future().get();
    CHECK(e.kind == control::NodeEvent::Kind::kSnapshotFetched);
    CHECK(e.how == "");
    CHECK(e.serial == 7);
    CHECK(e.bytes == 15);
  }
  CHECK(read_file(files[0]) == "the pause state");
  CHECK(to.names() == std::vector<std::string>{"shm.snapshot"});
}

TEST_CASE("SnapshotFetcher: a failed copy is an event with the reason") {
  TempDir from, to;
  Served s(from);  // serves no file
  std::promise<control::NodeEvent> got;
  SnapshotFetcher fetcher(
      "job-a", [&to] { return std::vector<std::string>{(to.path / "shm.snapshot").string()}; });
  fetcher.start(s.endpoint(), 3, [&got](const control::NodeEvent& e) { got.set_value(e); });
  const control::NodeEvent e = got.get_future().get();
  CHECK(e.serial == 3);
  CHECK(e.how.find("this node has no pause snapshot") != std::string::npos);
}

TEST_CASE("endpoints: IPv6 in brackets; the local address towards loopback is loopback") {
  TempDir from;
  Served s(from);
  CHECK(s.server->endpoint("::1") == "[::1]:" + std::to_string(s.server->port()));
  CHECK(local_address_towards("127.0.0.1", 29500) == "127.0.0.1");
}

}  // namespace
}  // namespace gpurun::supervisor
