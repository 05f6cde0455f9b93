#include "comm/gradient_sync.hpp"

#include <doctest/doctest.h>

#include <exception>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "comm/communicator.hpp"
#include "comm_options.hpp"
#include "gpurun/check.hpp"
#include "testing/store_server.hpp"

namespace gpurun::rt {

namespace {

// A communicator for a group of `size` identical ranks: all_reduce_sum multiplies by size.
// Fails (CommError) on the fail_at-th all_reduce_sum (1-based; 0 = never).
class FakeCommunicator final : public Communicator {
 public:
  FakeCommunicator(int size, int fail_at) : size_(size), fail_at_(fail_at) {}
  CommBackend backend() const override { return CommBackend::kGloo; }
  int rank() const override { return 0; }
  int size() const override { return size_; }
  at::Device device() const override { return at::kCPU; }
  void all_reduce_sum(at::Tensor& t) override {
    if (++calls_ == fail_at_) throw CommError("fake all_reduce_sum failure");
    t.mul_(size_);
  }
  void broadcast(at::Tensor&, int) override {}
  std::vector<int64_t> all_gather_int64(int64_t v) override {
    return std::vector<int64_t>(size_, v);
  }
  void barrier() override {}
  void synchronize() override {}
  void abort() noexcept override {}
  int calls() const { return calls_; }

 private:
  int size_;
  int fail_at_;
  int calls_ = 0;
};

// Deterministic values without the global RNG (the ranks are threads).
at::Tensor values(at::IntArrayRef shape, double seed, at::ScalarType dtype = at::kFloat) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return torch::sin(torch::arange(n, torch::kDouble) * 1.37 + seed).reshape(shape).to(dtype);
}

// A small model as plain tensors: two float layers, a float64 vector, a parameter only rank 0
// uses, and one nobody uses.
struct Model {
  std::vector<at::Tensor> params;  // w1 [4,3], b1 [4], w2 [2,4], d [3] f64, only0 [2], unused [5]

  static Model make() {
    Model m;
    m.params = {values({4, 3}, 1),           values({4}, 2), values({2, 4}, 3),
                values({3}, 4, at::kDouble), values({2}, 5), values({5}, 6)};
    for (auto& p : m.params) p.requires_grad_(true);
    return m;
  }

  // Loss of rank r on its own input; backward fills the grads of the used parameters.
  void backward(int r) {
    const at::Tensor x = values({6, 3}, 10.0 * (r + 1));
    at::Tensor h = torch::tanh(torch::matmul(x, params[0].t()) + params[1]);
    at::Tensor loss = torch::matmul(h, params[2].t()).pow(2).sum();
    loss = loss + (torch::matmul(x.to(torch::kDouble), params[3])).sin().sum().to(torch::kFloat);
    if (r == 0) loss = loss + (params[4] * x.sum()).sum();
    loss.backward();
  }
};

// Mean over ranks of each parameter's gradient, each rank computed alone (undefined = zeros).
std::vector<at::Tensor> reference_mean(int size) {
  std::vector<at::Tensor> sum;
  for (int r = 0; r < size; ++r) {
    Model m = Model::make();
    m.backward(r);
    for (size_t k = 0; k < m.params.size(); ++k) {
      const at::Tensor& g = m.params[k].grad();
      at::Tensor v = g.defined() ? g.clone() : torch::zeros_like(m.params[k]);
      if (r == 0) {
        sum.push_back(v.to(torch::kDouble));
      } else {
        sum[k] += v.to(torch::kDouble);
      }
    }
  }
  for (auto& s : sum) s /= size;
  return sum;
}

using testing::group_options;

}  // namespace

TEST_CASE("gradient sync: buckets are filled in reverse order, one dtype each, within the cap") {
  auto f = [](int64_t n) { return torch::zeros({n}); };
  auto d = [](int64_t n) { return torch::zeros({n}, torch::kDouble); };

  CHECK(GradientSync({f(2), f(2), f(2), f(2)}, 16).bucket_layout() ==
        std::vector<std::vector<size_t>>{{3, 2}, {1, 0}});
  CHECK(GradientSync({f(2), d(1), f(2), d(1)}).bucket_layout() ==
        std::vector<std::vector<size_t>>{{3, 1}, {2, 0}});
  // A parameter larger than the cap gets a bucket of its own.
  CHECK(GradientSync({f(1), f(100), f(1)}, 8).bucket_layout() ==
        std::vector<std::vector<size_t>>{{2}, {1}, {0}});
  CHECK(GradientSync({f(1), f(1), f(1)}).num_buckets() == 1);
  CHECK_THROWS_AS(GradientSync({f(1)}, 0), Error);
  CHECK_THROWS_AS(GradientSync({f(1), at::Tensor()}), Error);
}

TEST_CASE("gradient sync: average() needs a communicator and matching gradients") {
  Model m = Model::make();
  GradientSync sync(m.params);
  CHECK_THROWS_AS(sync.average(), Error);
  FakeCommunicator comm(2, 0);
  sync.set_communicator(&comm);
  m.params[0].mutable_grad() = torch::zeros({3, 4});
  CHECK_THROWS_AS(sync.average(), Error);
  CHECK(comm.calls() == 0);  // nothing was sent before the check failed
}

TEST_CASE("gradient sync: on CommError the gradients are unchanged; buffers are reused") {
  Model m = Model::make();
  m.backward(1);
  std::vector<at::Tensor> before;
  for (auto& p : m.params) before.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());

  GradientSync sync(m.params, 16);  // several buckets
  REQUIRE(sync.num_buckets() >= 3);
  FakeCommunicator failing(3, 2);
  sync.set_communicator(&failing);
  CHECK_THROWS_AS(sync.average(), CommError);
  for (size_t k = 0; k < m.params.size(); ++k) {
    CAPTURE(k);
    const at::Tensor& g = m.params[k].grad();
    CHECK(g.defined() == before[k].defined());
    if (g.defined()) CHECK(at::equal(g, before[k]));
  }

  // Identical ranks: the mean is the gradient itself; undefined ones become zeros.
  FakeCommunicator ok(3, 0);
  sync.set_communicator(&ok);
  sync.average();
  const int64_t bytes = sync.buffer_bytes();
  CHECK(bytes > 0);
  sync.average();
  CHECK(sync.buffer_bytes() == bytes);
  sync.release();
  CHECK(sync.buffer_bytes() == 0);
  sync.average();
  CHECK(sync.buffer_bytes() == bytes);
  for (size_t k = 0; k < m.params.size(); ++k) {
    CAPTURE(k);
    const at::Tensor& g = m.params[k].grad();
    REQUIRE(g.defined());
    CHECK(torch::allclose(g, before[k].defined() ? before[k] : torch::zeros_like(g)));
  }
}

#if GPURUN_HAVE_GLOO

TEST_CASE("gradient sync: 3 Gloo ranks end with the mean of the per-rank gradients") {
  constexpr int kSize = 3;
  const std::vector<at::Tensor> expected = reference_mean(kSize);
  // A rank's own gradient differs from the mean (or the test could not fail).
  {
    Model m = Model::make();
    m.backward(0);
    REQUIRE_FALSE(torch::allclose(m.params[0].grad().to(torch::kDouble), expected[0]));
  }
  store::testing::TestServer server;
  for (const int64_t cap : {int64_t{25} << 20, int64_t{16}}) {
    CAPTURE(cap);
    std::vector<std::vector<at::Tensor>> grads(kSize);
    std::vector<std::exception_ptr> errors(kSize);
    std::vector<std::thread> threads;
    for (int r = 0; r < kSize; ++r) {
      threads.emplace_back([&, r] {
        try {
          auto comm = make_communicator(
              CommBackend::kGloo,
              group_options(server.port(), fmt::format("t/grad/{}", cap), r, kSize));
          Model m = Model::make();
          GradientSync sync(m.params, cap);
          sync.set_communicator(comm.get());
          m.backward(r);
          sync.average();
          for (auto& p : m.params) grads[static_cast<size_t>(r)].push_back(p.grad());
        } catch (...) {
          errors[static_cast<size_t>(r)] = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < kSize; ++r) {
      CAPTURE(r);
      if (errors[static_cast<size_t>(r)]) {
        try {
          std::rethrow_exception(errors[static_cast<size_t>(r)]);
        } catch (const std::exception& e) {
          FAIL("rank threw: " << e.what());
        }
      }
      for (size_t k = 0; k < expected.size(); ++k) {
        CAPTURE(k);
        const at::Tensor& g = grads[static_cast<size_t>(r)][k];
        REQUIRE(g.defined());
        CHECK(torch::allclose(g.to(torch::kDouble), expected[k], 1e-5, 1e-6));
      }
      // Only rank 0 used params[4]: the mean is its gradient / 3; params[5]: zeros.
      CHECK(torch::count_nonzero(grads[static_cast<size_t>(r)][4]).item<int64_t>() > 0);
      CHECK(torch::count_nonzero(grads[static_cast<size_t>(r)][5]).item<int64_t>() == 0);
    }
  }
}

#endif  // GPURUN_HAVE_GLOO

}  // namespace gpurun::rt
