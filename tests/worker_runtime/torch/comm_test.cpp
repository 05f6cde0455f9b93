#include "comm/communicator.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <doctest/doctest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpurun/check.hpp"
#if GPURUN_HAVE_GLOO
#include "comm/gloo/communicator.hpp"
#endif
#include "comm_options.hpp"
#include "gpurun/store/client.hpp"
#include "testing/store_server.hpp"

namespace gpurun::rt {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

using testing::group_options;

// Runs fn(rank) on `size` threads; returns each rank's exception (null when it returned).
std::vector<std::exception_ptr> run_ranks(int size, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void require_no_errors(const std::vector<std::exception_ptr>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      FAIL("rank " << r << " threw: " << e.what());
    }
  }
}

// The CommError message of rank r, or "" when it threw nothing or something else.
std::string comm_error_message(const std::exception_ptr& e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const CommError& ce) {
    return ce.what();
  } catch (...) {
    return "";
  }
}

// Connects all `size` ranks of a group, then runs body(rank, comm) on each rank's thread.
void with_group(uint16_t port, const std::string& prefix, int size,
                const std::function<void(int, Communicator&)>& body,
                milliseconds timeout = milliseconds(5000)) {
  auto errors = run_ranks(size, [&](int r) {
    auto comm =
        make_communicator(CommBackend::kGloo, group_options(port, prefix, r, size, timeout));
    REQUIRE(comm->rank() == r);
    REQUIRE(comm->size() == size);
    body(r, *comm);
  });
  require_no_errors(errors);
}

// Rank r's input for the all-reduce tests: small integers, exact in every tested dtype.
at::Tensor rank_input(int r, at::ScalarType dtype) {
  return (at::arange(6, at::kDouble) * (r + 1) + r - 2).to(dtype);
}

}  // namespace

TEST_CASE("comm: backend names, availability and the error for a backend not built in") {
  CHECK(std::string(to_string(CommBackend::kGloo)) == "gloo");
  CHECK(std::string(to_string(CommBackend::kNccl)) == "nccl");
  CHECK(comm_backend_available(CommBackend::kGloo) == (GPURUN_HAVE_GLOO != 0));
  CHECK(comm_backend_available(CommBackend::kNccl) == (GPURUN_HAVE_NCCL != 0));
#if !GPURUN_HAVE_NCCL
  CommOptions o;
  o.prefix = "t/nccl";
  try {
    make_communicator(CommBackend::kNccl, o);
    FAIL("make_communicator(kNccl) succeeded in a build without NCCL");
  } catch (const Error& e) {
    CHECK(contains(e.what(), "GPURUN_WITH_CUDA=ON"));
  }
#endif
  CommOptions bad;
  bad.prefix = "t/bad";
  bad.rank = 3;
  bad.size = 3;
  CHECK_THROWS_AS(make_communicator(CommBackend::kGloo, bad), Error);
}

#if GPURUN_HAVE_GLOO

TEST_CASE("a group of one meets no one: no store connection, identity collectives, abort ends it") {
  CommOptions o;
  o.prefix = "t/solo";
  o.store.host = "127.0.0.1";
  o.store.port = 1;  // nothing listens there: a rendezvous would fail
  o.store.timeout = milliseconds(200);
  o.timeout = milliseconds(200);
  auto c = make_communicator(CommBackend::kGloo, o);
  CHECK(c->rank() == 0);
  CHECK(c->size() == 1);
  at::Tensor t = at::arange(5, at::kFloat);
  c->all_reduce_sum(t);
  CHECK(at::equal(t, at::arange(5, at::kFloat)));
  c->broadcast(t, 0);
  CHECK(at::equal(t, at::arange(5, at::kFloat)));
  CHECK_THROWS_AS(c->broadcast(t, 1), Error);
  CHECK(c->all_gather_int64(42) == std::vector<int64_t>{42});
  c->barrier();
  c->synchronize();
  c->abort();
  CHECK_THROWS_AS(c->all_reduce_sum(t), CommError);
  CHECK_THROWS_AS(c->barrier(), CommError);
}

TEST_CASE("gloo: all_reduce_sum of every supported dtype equals the sum of the ranks' inputs") {
  store::testing::TestServer server;
  constexpr int kSize = 3;
  const std::vector<at::ScalarType> dtypes{at::kFloat,    at::kDouble, at::kHalf,
                                           at::kBFloat16, at::kInt,    at::kLong};
  at::Tensor expected = at::zeros({6}, at::kDouble);
  for (int r = 0; r < kSize; ++r) expected += rank_input(r, at::kDouble);

  std::vector<std::vector<at::Tensor>> results(kSize);
  with_group(server.port(), "t/allreduce", kSize, [&](int r, Communicator& comm) {
    for (auto dtype : dtypes) {
      at::Tensor t = rank_input(r, dtype).reshape({2, 3});
      comm.all_reduce_sum(t);
      results[static_cast<size_t>(r)].push_back(t);
    }
  });
  for (int r = 0; r < kSize; ++r) {
    for (size_t i = 0; i < dtypes.size(); ++i) {
      const at::Tensor& t = results[static_cast<size_t>(r)][i];
      CAPTURE(r);
      CAPTURE(c10::toString(dtypes[i]));
      CHECK((t.scalar_type() == dtypes[i]));
      CHECK((t.sizes() == at::IntArrayRef({2, 3})));
      CHECK(at::equal(t.to(at::kDouble).reshape({6}), expected));
    }
  }
}

TEST_CASE("gloo: broadcast copies the root's bytes; all_gather_int64 is ordered by rank") {
  store::testing::TestServer server;
  constexpr int kSize = 3;
  constexpr int kRoot = 2;
  std::vector<at::Tensor> floats(kSize), longs(kSize), bytes(kSize);
  std::vector<std::vector<int64_t>> gathered(kSize);
  with_group(server.port(), "t/bcast", kSize, [&](int r, Communicator& comm) {
    at::Tensor f = at::randn({4, 5});
    at::Tensor l = at::arange(7, at::kLong) * 1000 + r;
    at::Tensor b = at::full({3}, r, at::kBool);  // raw bytes: any dtype
    comm.broadcast(f, kRoot);
    comm.broadcast(l, kRoot);
    comm.broadcast(b, kRoot);
    floats[static_cast<size_t>(r)] = f;
    longs[static_cast<size_t>(r)] = l;
    bytes[static_cast<size_t>(r)] = b;
    gathered[static_cast<size_t>(r)] = comm.all_gather_int64(100 * r + 7 - (r == 1 ? 500 : 0));
  });
  for (int r = 0; r < kSize; ++r) {
    CAPTURE(r);
    CHECK(at::equal(floats[static_cast<size_t>(r)], floats[kRoot]));
    CHECK(at::equal(longs[static_cast<size_t>(r)], at::arange(7, at::kLong) * 1000 + kRoot));
    CHECK(at::equal(bytes[static_cast<size_t>(r)], at::full({3}, true, at::kBool)));
    CHECK(gathered[static_cast<size_t>(r)] == std::vector<int64_t>{7, -393, 207});
  }
  // randn differs per rank, so equality above really came from the root.
  CHECK_FALSE(at::equal(floats[0], at::zeros({4, 5})));
}

TEST_CASE("gloo: a large broadcast moves in pieces over several TCP streams, bytes intact") {
  store::testing::TestServer server;
  store::ClientOptions co;
  co.port = server.port();
  store::Client observer(co);
  const int64_t before = observer.num_keys();
  constexpr int kSize = 3;
  constexpr int kRoot = 1;
  // An odd size: the last lane's piece is shorter than the others.
  constexpr int64_t kBytes = (int64_t{16} << 20) + 12345;
  for (const char* lanes : {"1", "3"}) {
    CAPTURE(lanes);
    ::setenv("GPURUN_GLOO_LANES", lanes, 1);
    std::vector<at::Tensor> got(kSize);
    with_group(server.port(), fmt::format("t/lanes/{}", lanes), kSize,
               [&](int r, Communicator& comm) {
                 at::Tensor t = at::randint(0, 255, {kBytes}, at::kByte);
                 comm.broadcast(t, kRoot);
                 at::Tensor again = at::full({kBytes / 4}, r, at::kInt);  // lanes reused
                 comm.broadcast(again, kRoot);
                 CHECK(at::equal(again, at::full({kBytes / 4}, kRoot, at::kInt)));
                 got[static_cast<size_t>(r)] = t;
               });
    for (int r = 0; r < kSize; ++r) CHECK(at::equal(got[static_cast<size_t>(r)], got[kRoot]));
    CHECK(observer.num_keys() == before);  // the extra lanes' rendezvous keys are gone too
  }
  ::setenv("GPURUN_GLOO_LANES", "many", 1);
  const auto bad = run_ranks(2, [&](int r) {
    (void)make_communicator(CommBackend::kGloo, group_options(server.port(), "t/lanes/bad", r, 2));
  });
  ::unsetenv("GPURUN_GLOO_LANES");
  for (const auto& e : bad) {
    REQUIRE(e);
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      CHECK_MESSAGE(contains(err.what(), "GPURUN_GLOO_LANES='many'"), err.what());
    }
  }
}

TEST_CASE("gloo: a rank gone during a broadcast over several lanes fails the others") {
  const auto timeout = milliseconds(2000);
  store::testing::TestServer server;
  ::setenv("GPURUN_GLOO_LANES", "2", 1);
  std::vector<milliseconds> took(3);
  auto errors = run_ranks(3, [&](int r) {
    auto comm = make_communicator(CommBackend::kGloo,
                                  group_options(server.port(), "t/lanes/gone", r, 3, timeout));
    at::Tensor t = at::ones({int64_t{16} << 20}, at::kByte);
    comm->broadcast(t, 0);  // every lane connected
    if (r == 2) {
      std::this_thread::sleep_for(milliseconds(200));
      comm.reset();  // like a process exiting: every lane's connections closed
      return;
    }
    const auto t0 = Clock::now();
    try {
      for (int i = 0; i < 50; ++i) comm->broadcast(t, 0);
    } catch (...) {
      took[static_cast<size_t>(r)] = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
      throw;
    }
  });
  ::unsetenv("GPURUN_GLOO_LANES");
  const std::string msg = comm_error_message(errors[0]);
  CHECK_MESSAGE(contains(msg, "broadcast"), msg);
  CHECK(took[0] < timeout);
  CHECK_FALSE(errors[2]);
}

TEST_CASE("gloo: barrier waits for the last rank") {
  store::testing::TestServer server;
  constexpr int kSize = 3;
  std::vector<milliseconds> waited(kSize);
  with_group(server.port(), "t/barrier", kSize, [&](int r, Communicator& comm) {
    comm.barrier();  // everyone ready: the timing below measures only the late rank
    if (r == 1) std::this_thread::sleep_for(milliseconds(300));
    const auto t0 = Clock::now();
    comm.barrier();
    comm.synchronize();
    waited[static_cast<size_t>(r)] = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
  });
  CHECK(waited[0] >= milliseconds(250));
  CHECK(waited[2] >= milliseconds(250));
}

TEST_CASE("gloo: the rendezvous deletes its keys; a next generation of another size works") {
  store::testing::TestServer server;
  store::ClientOptions co;
  co.port = server.port();
  store::Client observer(co);
  observer.set("gpurun/generation", "0");  // an unrelated key that must survive
  const int64_t before = observer.num_keys();

  std::vector<at::Tensor> gen0(3), gen1(2);
  with_group(server.port(), "gpurun/gen/0/comm/train", 3, [&](int r, Communicator& comm) {
    at::Tensor t = at::full({2}, r + 1, at::kFloat);
    comm.all_reduce_sum(t);
    gen0[static_cast<size_t>(r)] = t;
  });
  CHECK(observer.num_keys() == before);

  with_group(server.port(), "gpurun/gen/1/comm/train", 2, [&](int r, Communicator& comm) {
    at::Tensor t = at::full({2}, 10 * (r + 1), at::kLong);
    comm.all_reduce_sum(t);
    CHECK(comm.all_gather_int64(r) == std::vector<int64_t>{0, 1});
    gen1[static_cast<size_t>(r)] = t;
  });
  CHECK(observer.num_keys() == before);
  for (const auto& k : observer.list_keys()) CHECK_FALSE(contains(k, "/comm/train"));
  for (const auto& t : gen0) CHECK(at::equal(t, at::full({2}, 6, at::kFloat)));
  for (const auto& t : gen1) CHECK(at::equal(t, at::full({2}, 30, at::kLong)));
}

TEST_CASE("gloo: bad arguments throw gpurun::Error and leave the communicator usable") {
  store::testing::TestServer server;
  auto comm = make_communicator(CommBackend::kGloo, group_options(server.port(), "t/args", 0, 1));
  at::Tensor strided = at::zeros({4, 4}).t();
  at::Tensor flags = at::zeros({3}, at::kBool);
  at::Tensor undefined;
  auto check_plain_error = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      FAIL("no exception; expected one containing: " << needle);
    } catch (const CommError& e) {
      FAIL("CommError for a bad argument: " << e.what());
    } catch (const Error& e) {
      CHECK_MESSAGE(contains(e.what(), needle), e.what());
    }
  };
  check_plain_error([&] { comm->all_reduce_sum(strided); }, "not contiguous");
  check_plain_error([&] { comm->all_reduce_sum(flags); }, "not supported");
  check_plain_error([&] { comm->all_reduce_sum(undefined); }, "undefined");
  check_plain_error([&] { comm->broadcast(flags, 1); }, "root 1");
  at::Tensor t = at::ones({3});
  comm->all_reduce_sum(t);
  CHECK(at::equal(t, at::ones({3})));
  CHECK(comm->all_gather_int64(42) == std::vector<int64_t>{42});

  CommOptions cuda = group_options(server.port(), "t/args-cuda", 0, 1);
  cuda.device = at::Device(at::kCUDA, 0);
  CHECK_THROWS_AS(make_communicator(CommBackend::kGloo, cuda), Error);
}

TEST_CASE("gloo: a rank that never shows up makes the others fail within the timeout") {
  store::testing::TestServer server;
  store::ClientOptions co;
  co.port = server.port();
  store::Client observer(co);
  const int64_t before = observer.num_keys();
  const auto timeout = milliseconds(1500);
  std::vector<milliseconds> took(2);
  auto errors = run_ranks(2, [&](int r) {  // rank 2 of 3 never comes
    const auto t0 = Clock::now();
    try {
      make_communicator(CommBackend::kGloo,
                        group_options(server.port(), "t/absent", r, 3, timeout));
    } catch (...) {
      took[static_cast<size_t>(r)] = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
      throw;
    }
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    const std::string msg = comm_error_message(errors[static_cast<size_t>(r)]);
    CHECK_MESSAGE(contains(msg, "t/absent"), msg);
    CHECK_MESSAGE(contains(msg, "missing ranks: 2"), msg);
    CHECK(took[static_cast<size_t>(r)] >= timeout - milliseconds(100));
    CHECK(took[static_cast<size_t>(r)] < timeout + milliseconds(3000));
  }
  CHECK(observer.num_keys() == before);
}

TEST_CASE("gloo: a rank that aborts or goes away mid-collective makes the others fail") {
  const auto timeout = milliseconds(2000);
  for (const bool destroy : {false, true}) {
    CAPTURE(destroy);
    store::testing::TestServer server;
    std::vector<milliseconds> took(3);
    std::string late_call_error;
    auto errors = run_ranks(3, [&](int r) {
      auto comm = make_communicator(CommBackend::kGloo,
                                    group_options(server.port(), "t/abort", r, 3, timeout));
      at::Tensor warmup = at::ones({8});
      comm->all_reduce_sum(warmup);  // the group works before the failure
      if (r == 2) {
        std::this_thread::sleep_for(milliseconds(200));  // the others are blocked by now
        if (destroy) {
          comm.reset();  // like a process exiting: connections closed
          return;
        }
        comm->abort();
        at::Tensor t = at::ones({8});
        try {
          comm->all_reduce_sum(t);
        } catch (const CommError& e) {
          late_call_error = e.what();
        }
        return;
      }
      at::Tensor big = at::ones({1 << 16});
      const auto t0 = Clock::now();
      try {
        comm->all_reduce_sum(big);
      } catch (...) {
        took[static_cast<size_t>(r)] = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
        // Unusable afterwards: a later call fails at once with CommError.
        CHECK_THROWS_AS(comm->barrier(), CommError);
        throw;
      }
    });
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      const std::string msg = comm_error_message(errors[static_cast<size_t>(r)]);
      CHECK_MESSAGE(contains(msg, "all_reduce_sum"), msg);
      CHECK_MESSAGE(contains(msg, "t/abort"), msg);
      CHECK_MESSAGE(contains(msg, fmt::format("rank {} of 3", r)), msg);
      CHECK(took[static_cast<size_t>(r)] < timeout + milliseconds(2000));
    }
    CHECK_FALSE(errors[2]);
    if (!destroy) CHECK(contains(late_call_error, "aborted"));
  }
}

TEST_CASE("gloo: the device listens where the other nodes can reach it") {
  // One node: loopback, as before.
  for (const std::string host : {"127.0.0.1", "localhost", "::1", "[::1]", ""}) {
    CAPTURE(host);
    const GlooListenAddress a = gloo_listen_address(host, "");
    CHECK(a.hostname == "127.0.0.1");
    CHECK(a.iface.empty());
  }
  // torch's GLOO_SOCKET_IFNAME wins; its first interface.
  const GlooListenAddress named = gloo_listen_address("10.1.2.3", "ib0,eth0");
  CHECK(named.iface == "ib0");
  CHECK(named.hostname.empty());
  // Several nodes: this host's address on the route to the master. Toward one of this host's
  // own non-loopback addresses, the route's source address is that address (before: always
  // 127.0.0.1, which no other node can dial).
  ifaddrs* list = nullptr;
  REQUIRE(::getifaddrs(&list) == 0);
  std::string own;
  for (ifaddrs* i = list; i && own.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    if (std::string(text).rfind("127.", 0) != 0) own = text;
  }
  ::freeifaddrs(list);
  if (own.empty()) {
    MESSAGE("skipped the route case: this host has no non-loopback IPv4 address");
    return;
  }
  CAPTURE(own);
  CHECK(gloo_listen_address(own, "").hostname == own);
}

#endif  // GPURUN_HAVE_GLOO

}  // namespace gpurun::rt
