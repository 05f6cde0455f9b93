// store_bench: throughput and rendezvous time of a TCPStore-protocol store.
//
//   store_bench [--host H --port P] [--threads N] [--ops M] [--rendezvous K[,K...]]
//               [--server-threads S] [--json PATH]
//
// Without --port it starts gpurun's store in a child process on 127.0.0.1
// (port 0) with S reactor threads (default: ServerOptions' default,
// min(cores, 8)). With --host/--port it targets any TCPStore server, e.g.
// torch's own (bench/anchors/torch_store_server.py), so both can be compared
// on one machine. --json writes the results to PATH as one JSON object.
//   throughput: N threads, one connection each, M ops each cycling
//               SET, GET (= WAIT + GET), ADD, WAIT on a present key.
//   rendezvous: K connections opened and handshaken by 16 threads at once (timed:
//               "connect+handshake"), then each ADDs a counter and WAITs on a barrier
//               key that the last arriver SETs (the torch store-based barrier); prints
//               the time until all K are released.
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <boost/asio/io_context.hpp>

#include "gpurun/store/client.hpp"
#include "gpurun/store/frame_codec.hpp"
#include "store/server.hpp"

namespace store = gpurun::store;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  int threads = 8;
  int ops = 20000;
  std::vector<int> rendezvous;
  std::size_t server_threads = 0;  // 0 = ServerOptions' default
  std::string json_path;
};

struct ThroughputResult {
  double seconds = 0;
  double ops_per_s = 0;
  int errors = 0;
};

struct RendezvousResult {
  int connections = 0;
  double connect_handshake_ms = 0;  // all K connections: TCP connect + VALIDATE + PING echo
  double barrier_ms = 0;            // ADD + WAIT until the last connection is released
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value after " + f);
      return argv[++i];
    };
    if (f == "--host") {
      a.host = next();
    } else if (f == "--port") {
      a.port = static_cast<uint16_t>(std::stoi(next()));
    } else if (f == "--threads") {
      a.threads = std::stoi(next());
    } else if (f == "--ops") {
      a.ops = std::stoi(next());
    } else if (f == "--server-threads") {
      a.server_threads = static_cast<std::size_t>(std::stoul(next()));
    } else if (f == "--json") {
      a.json_path = next();
    } else if (f == "--rendezvous") {
      std::string list = next();
      for (std::size_t p = 0; p < list.size();) {
        std::size_t c = list.find(',', p);
        a.rendezvous.push_back(std::stoi(list.substr(p, c - p)));
        p = c == std::string::npos ? list.size() : c + 1;
      }
    } else {
      throw std::runtime_error("unknown flag " + f +
                               " (flags: --host --port --threads --ops --rendezvous K[,K] "
                               "--server-threads S --json PATH)");
    }
  }
  return a;
}

void raise_nofile() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
  ::getrlimit(RLIMIT_NOFILE, &r);
  std::printf("RLIMIT_NOFILE: %llu\n", static_cast<unsigned long long>(r.rlim_cur));
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A blocking connection that speaks raw frames (for thousands of connections
// without a thread each).
class Conn {
 public:
  Conn(const std::string& host, uint16_t port) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) {
      throw std::runtime_error("cannot resolve " + host);
    }
    fd_ = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int rc = -1;
    for (int attempt = 0; attempt < 200 && rc != 0; ++attempt) {
      rc = ::connect(fd_, res->ai_addr, res->ai_addrlen);
      if (rc != 0) {
        ::close(fd_);
        fd_ = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    ::freeaddrinfo(res);
    if (rc != 0) throw std::runtime_error(fmt::format("connect failed: {}", std::strerror(errno)));
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    timeval tv{60, 0};  // a store that stops answering fails the bench instead of hanging it
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    store::Request v{store::QueryType::kValidate, {}, {}, 0, store::kValidationMagic};
    store::Request p{store::QueryType::kPing, {}, {}, 0, static_cast<uint32_t>(::getpid())};
    send(v, p);
    uint8_t echo[4];
    read(echo, 4);
  }
  ~Conn() { ::close(fd_); }
  template <class... R>
  void send(const R&... reqs) {
    std::string out;
    (store::encode_request(reqs, out), ...);
    std::size_t sent = 0;
    while (sent < out.size()) {
      ssize_t n = ::send(fd_, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("send failed");
      sent += static_cast<std::size_t>(n);
    }
  }
  void read(void* dst, std::size_t n) {
    auto* p = static_cast<uint8_t*>(dst);
    while (n > 0) {
      ssize_t r = ::recv(fd_, p, n, 0);
      if (r <= 0) throw std::runtime_error("store closed the connection");
      p += r;
      n -= static_cast<std::size_t>(r);
    }
  }

 private:
  int fd_ = -1;
};

ThroughputResult throughput(const Args& a, uint16_t port) {
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::atomic<int> errors{0};
  for (int t = 0; t < a.threads; ++t) {
    threads.emplace_back([&, t] {
      try {
        store::ClientOptions o;
        o.host = a.host;
        o.port = port;
        o.timeout = std::chrono::seconds(60);
        store::Client c(o);
        const std::string key = fmt::format("/bench/{}", t);
        const std::string counter = fmt::format("/bench/n{}", t);
        c.set(key, "value-0123456789");
        ++ready;
        while (!go) std::this_thread::yield();
        for (int i = 0; i < a.ops; ++i) {
          switch (i % 4) {
            case 0:
              c.set(key, "value-0123456789");
              break;
            case 1:
              c.get(key);
              break;
            case 2:
              c.add(counter, 1);
              break;
            case 3:
              c.wait({key});
              break;
          }
        }
        c.ping();  // SET has no reply: make sure the server applied everything
      } catch (const std::exception& e) {
        std::fprintf(stderr, "thread %d: %s\n", t, e.what());
        ++errors;
      }
    });
  }
  while (ready + errors < a.threads) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto start = Clock::now();
  go = true;
  for (auto& th : threads) th.join();
  const double s = seconds_since(start);
  const double total = double(a.threads) * a.ops;
  std::printf("throughput: %d threads x %d ops (set/get/add/wait) in %.3f s = %.0f ops/s%s\n",
              a.threads, a.ops, s, total / s, errors ? " (WITH ERRORS)" : "");
  return ThroughputResult{s, total / s, errors.load()};
}

RendezvousResult rendezvous(const Args& a, uint16_t port, int k) {
  // K workers connect at about the same time (each its own process in a real job): 16
  // threads here each open and handshake every 16th connection.
  const int nthreads = std::min(16, k);
  const auto setup_start = Clock::now();
  std::vector<std::unique_ptr<Conn>> conns(static_cast<std::size_t>(k));
  {
    std::vector<std::thread> openers;
    for (int t = 0; t < nthreads; ++t)
      openers.emplace_back([&, t] {
        for (int i = t; i < k; i += nthreads)
          conns[static_cast<std::size_t>(i)] = std::make_unique<Conn>(a.host, port);
      });
    for (auto& th : openers) th.join();
  }
  const double setup = seconds_since(setup_start);
  const std::string counter = fmt::format("/bench/rdzv{}/{}", k, ::getpid());
  const std::string barrier = counter + ":last_worker";
  std::atomic<int> started{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < nthreads; ++t) {
    threads.emplace_back([&, t] {
      ++started;
      while (!go) std::this_thread::yield();
      std::vector<Conn*> mine;
      for (int i = t; i < k; i += nthreads)
        mine.push_back(conns[static_cast<std::size_t>(i)].get());
      for (Conn* c : mine) c->send(store::Request{store::QueryType::kAdd, {counter}, {}, 1, 0});
      for (Conn* c : mine) {
        uint8_t b[8];
        c->read(b, 8);
        int64_t v = 0;
        std::memcpy(&v, b, 8);
        if (v == k) c->send(store::Request{store::QueryType::kSet, {barrier}, {"1"}, 0, 0});
        c->send(store::Request{store::QueryType::kWait, {barrier}, {}, 0, 0});
      }
      for (Conn* c : mine) {
        uint8_t b;
        c->read(&b, 1);
      }
    });
  }
  while (started < nthreads) std::this_thread::yield();
  const auto start = Clock::now();
  go = true;
  for (auto& th : threads) th.join();
  const double released = seconds_since(start);
  std::printf(
      "rendezvous: %d connections: ADD + WAIT barrier released all in %.1f ms "
      "(connect+handshake of all: %.1f ms)\n",
      k, released * 1e3, setup * 1e3);
  return RendezvousResult{k, setup * 1e3, released * 1e3};
}

void write_json(const std::string& path, const std::string& target, std::size_t server_threads,
                const Args& a, const ThroughputResult* tp,
                const std::vector<RendezvousResult>& rdzv) {
  std::string out = "{\n";
  out += fmt::format("  \"target\": \"{}\",\n", target);
  out += fmt::format("  \"server_threads\": {},\n",
                     server_threads == 0 ? std::string("null") : std::to_string(server_threads));
  if (tp != nullptr) {
    out += fmt::format(
        "  \"throughput\": {{\"client_threads\": {}, \"ops_per_thread\": {}, \"seconds\": "
        "{:.3f}, \"ops_per_s\": {:.0f}, \"errors\": {}}},\n",
        a.threads, a.ops, tp->seconds, tp->ops_per_s, tp->errors);
  } else {
    out += "  \"throughput\": null,\n";
  }
  out += "  \"rendezvous\": [";
  for (std::size_t i = 0; i < rdzv.size(); ++i) {
    const auto& r = rdzv[i];
    out += fmt::format(
        "{}\n    {{\"connections\": {}, \"connect_handshake_ms\": {:.1f}, \"barrier_ms\": "
        "{:.1f}, \"total_ms\": {:.1f}}}",
        i == 0 ? "" : ",", r.connections, r.connect_handshake_ms, r.barrier_ms,
        r.connect_handshake_ms + r.barrier_ms);
  }
  out += rdzv.empty() ? "]\n}\n" : "\n  ]\n}\n";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error("cannot write " + path);
}

// Runs gpurun's store in a child process (its own file-descriptor limit and
// CPU, like torch's server in its own Python process) and returns its port.
// Called before any thread exists, so fork() is safe.
pid_t fork_server(uint16_t& port, std::size_t threads, std::size_t& threads_used) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::close(fds[0]);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    boost::asio::io_context io;
    store::ServerOptions o;
    o.hosts = {"127.0.0.1"};
    o.threads = threads;
    o.log = [](const std::string& l) { std::fprintf(stderr, "store: %s\n", l.c_str()); };
    store::Server server(io, o);
    const uint16_t p = server.port();
    const auto used = static_cast<uint32_t>(server.threads());
    if (::write(fds[1], &p, sizeof(p)) != sizeof(p)) ::_exit(1);
    if (::write(fds[1], &used, sizeof(used)) != sizeof(used)) ::_exit(1);
    ::close(fds[1]);
    io.run();
    ::_exit(0);
  }
  ::close(fds[1]);
  uint32_t used = 0;
  if (::read(fds[0], &port, sizeof(port)) != sizeof(port) ||
      ::read(fds[0], &used, sizeof(used)) != sizeof(used)) {
    throw std::runtime_error("store child process did not start");
  }
  threads_used = used;
  ::close(fds[0]);
  return pid;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a = parse(argc, argv);
    raise_nofile();
    uint16_t port = a.port;
    pid_t child = -1;
    std::size_t server_threads = 0;
    std::string target;
    if (port == 0) {
      child = fork_server(port, a.server_threads, server_threads);
      a.host = "127.0.0.1";
      target = "gpurun";
      std::printf(
          "target: gpurun store in a child process (pid %d) on 127.0.0.1:%u, %zu reactor "
          "thread(s)\n",
          static_cast<int>(child), port, server_threads);
    } else {
      target = fmt::format("external {}:{}", a.host, port);
      std::printf("target: external store at %s:%u\n", a.host.c_str(), port);
    }
    std::optional<ThroughputResult> tp;
    if (a.threads > 0 && a.ops > 0) tp = throughput(a, port);
    std::vector<RendezvousResult> rdzv;
    for (int k : a.rendezvous) rdzv.push_back(rendezvous(a, port, k));
    if (!a.json_path.empty()) {
      write_json(a.json_path, target, server_threads, a, tp ? &*tp : nullptr, rdzv);
    }
    if (child > 0) {
      ::kill(child, SIGTERM);
      ::waitpid(child, nullptr, 0);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_bench: %s\n", e.what());
    return 1;
  }
}
