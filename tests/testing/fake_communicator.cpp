#include "testing/fake_communicator.hpp"

#include <chrono>
#include <cstring>

#include <fmt/format.h>

namespace gpurun::testing {

using Clock = std::chrono::steady_clock;

/// One group: a rendezvous count and one exchange per collective, in the order each rank
/// calls them (the k-th collective of every rank meet).
struct InProcessComms::Group {
  std::mutex mu;
  std::condition_variable cv;
  std::string prefix;
  int size = 0;
  int arrived = 0;  // rendezvous
  bool broken = false;
  std::string why;
  struct Exchange {
    std::vector<at::Tensor> in;
    int deposited = 0;
    int taken = 0;
  };
  std::map<int64_t, Exchange> exchanges;

  void breakdown(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu);
    if (!broken) {
      broken = true;
      why = reason;
    }
    cv.notify_all();
  }
};

namespace {

class FakeCommunicator final : public rt::Communicator {
 public:
  FakeCommunicator(InProcessComms& owner, std::shared_ptr<InProcessComms::Group> g,
                   const rt::CommOptions& o, int slot)
      : owner_(owner),
        g_(std::move(g)),
        rank_(o.rank),
        size_(o.size),
        device_(o.device),
        timeout_(o.timeout),
        slot_(slot) {}
  ~FakeCommunicator() override { abort(); }

  rt::CommBackend backend() const override { return rt::CommBackend::kGloo; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  at::Device device() const override { return device_; }

  void all_reduce_sum(at::Tensor& t) override {
    exchange("all_reduce_sum", t, [](const std::vector<at::Tensor>& in) {
      at::Tensor sum = in[0].clone();
      for (size_t r = 1; r < in.size(); ++r) sum.add_(in[r]);
      return sum;
    });
  }
  void broadcast(at::Tensor& t, int root) override {
    exchange("broadcast", t, [root](const std::vector<at::Tensor>& in) {
      return in.at(static_cast<size_t>(root));
    });
  }
  std::vector<int64_t> all_gather_int64(int64_t value) override {
    at::Tensor t = at::full({1}, value, at::TensorOptions().dtype(at::kLong));
    std::vector<int64_t> out;
    exchange("all_gather_int64", t, [&out](const std::vector<at::Tensor>& in) {
      for (const at::Tensor& x : in) out.push_back(x.item<int64_t>());
      return at::Tensor();
    });
    return out;
  }
  void barrier() override {
    at::Tensor t = at::zeros({1});
    exchange("barrier", t, [](const std::vector<at::Tensor>&) { return at::Tensor(); });
  }
  // Every collective here has finished when it returns: a group broken after that fails the
  // next collective, not this wait (a peer's death after a completed all-reduce leaves it done).
  void synchronize() override {
    std::lock_guard<std::mutex> lock(g_->mu);
    if (aborted_) throw_broken("synchronize");
  }
  void abort() noexcept override {
    if (aborted_) return;
    aborted_ = true;
    g_->breakdown(fmt::format("rank {} aborted its communicator", rank_));
  }

 private:
  [[noreturn]] void throw_broken(const char* op) const {
    throw rt::CommError(fmt::format("fake {} in group '{}' (rank {} of {}): {}", op, g_->prefix,
                                    rank_, size_, aborted_ ? "communicator aborted" : g_->why));
  }

  template <class Reduce>
  void exchange(const char* op, at::Tensor& t, Reduce reduce) {
    std::optional<InProcessComms::Fault> fault = owner_.on_collective(slot_);
    const bool fail_after = fault == InProcessComms::Fault::kFailAfter;
    if (fail_after) fault.reset();
    if (fault) {
      const std::string why =
          fmt::format("rank {} (slot {}) {} at its {}", rank_, slot_,
                      *fault == InProcessComms::Fault::kDie ? "died" : "failed", op);
      aborted_ = true;
      g_->breakdown(why);
      if (*fault == InProcessComms::Fault::kDie) throw SimulatedDeath(why);
      throw rt::CommError(fmt::format("fake {} in group '{}': {}", op, g_->prefix, why));
    }
    const int64_t k = seq_++;
    std::unique_lock<std::mutex> lock(g_->mu);
    if (aborted_ || g_->broken) throw_broken(op);
    auto& ex = g_->exchanges[k];
    if (ex.in.empty()) ex.in.resize(static_cast<size_t>(size_));
    ex.in[static_cast<size_t>(rank_)] = t.detach().to(at::kCPU).clone();
    ++ex.deposited;
    g_->cv.notify_all();
    const auto deadline = Clock::now() + timeout_;
    while (ex.deposited < size_ && !g_->broken) {
      if (g_->cv.wait_until(lock, deadline) == std::cv_status::timeout) {
        g_->broken = true;
        g_->why = fmt::format("{} timed out after {} ms", op, timeout_.count());
        g_->cv.notify_all();
      }
    }
    // Complete once every rank deposited, even when a peer broke the group right after.
    if (ex.deposited < size_) throw_broken(op);
    const at::Tensor out = reduce(ex.in);
    if (++ex.taken == size_) g_->exchanges.erase(k);
    lock.unlock();
    if (fail_after) {  // the peers have their result; this rank does not
      const std::string why =
          fmt::format("rank {} (slot {}) failed at the end of its {}", rank_, slot_, op);
      aborted_ = true;
      g_->breakdown(why);
      throw rt::CommError(fmt::format("fake {} in group '{}': {}", op, g_->prefix, why));
    }
    if (out.defined()) t.copy_(out.to(t.device()));
  }

  InProcessComms& owner_;
  std::shared_ptr<InProcessComms::Group> g_;
  int rank_, size_;
  at::Device device_;
  std::chrono::milliseconds timeout_;
  int slot_;
  int64_t seq_ = 0;
  bool aborted_ = false;
};

}  // namespace

rt::CommFactory InProcessComms::factory(int slot) {
  return
      [this, slot](rt::CommBackend, const rt::CommOptions& o) -> std::unique_ptr<rt::Communicator> {
        std::shared_ptr<Group> g;
        {
          std::lock_guard<std::mutex> lock(mu_);
          auto& slot_group = groups_[o.prefix];
          if (!slot_group) {
            slot_group = std::make_shared<Group>();
            slot_group->prefix = o.prefix;
            slot_group->size = o.size;
          }
          g = slot_group;
          ++communicators_;
        }
        std::unique_lock<std::mutex> lock(g->mu);
        if (g->size != o.size)
          throw Error(fmt::format("fake rendezvous '{}': size {} but the group has {}", o.prefix,
                                  o.size, g->size));
        ++g->arrived;
        g->cv.notify_all();
        const auto deadline = Clock::now() + o.timeout;
        while (g->arrived < g->size && !g->broken) {
          if (g->cv.wait_until(lock, deadline) == std::cv_status::timeout)
            throw rt::CommError(fmt::format("fake rendezvous '{}': {} of {} ranks arrived in {} ms",
                                            o.prefix, g->arrived, g->size, o.timeout.count()));
        }
        if (g->broken)
          throw rt::CommError(fmt::format("fake rendezvous '{}': {}", o.prefix, g->why));
        lock.unlock();
        return std::make_unique<FakeCommunicator>(*this, g, o, slot);
      };
}

void InProcessComms::fail_at(int slot, int64_t n, Fault fault) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_[slot] = {count_[slot] + n, fault};
}

std::optional<InProcessComms::Fault> InProcessComms::on_collective(int slot) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t n = ++count_[slot];
  auto it = faults_.find(slot);
  if (it == faults_.end() || it->second.first != n) return std::nullopt;
  const Fault f = it->second.second;
  faults_.erase(it);
  return f;
}

int64_t InProcessComms::collectives(int slot) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = count_.find(slot);
  return it == count_.end() ? 0 : it->second;
}

int64_t InProcessComms::communicators() const {
  std::lock_guard<std::mutex> lock(mu_);
  return communicators_;
}

}  // namespace gpurun::testing
