#include "state/state_registry.hpp"

#include <doctest/doctest.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gpurun/snapshot/format.hpp"
#include "gpurun/snapshot/snapshot_file.hpp"
#include "gpurun/snapshot/snapshot_store.hpp"
#include "gpurun/snapshot/xxh64.hpp"
#include "gpurun_process.hpp"  // TempDir
#include "state/state_checksum.hpp"

using gpurun::StateExtension;
using gpurun::rt::StateError;
using gpurun::rt::StateRegistry;
namespace rt = gpurun::rt;

namespace {

namespace optim = torch::optim;

// A small model with parameters and buffers of two dtypes (BatchNorm's running stats, and its
// 0-dim int64 batch counter).
struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t hidden = 16)
      : fc1(register_module("fc1", torch::nn::Linear(8, hidden))),
        bn(register_module("bn", torch::nn::BatchNorm1d(hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(bn(fc1(x)))); }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d bn;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Net);

enum class Kind { kAdam, kAdamW, kSgd, kRmsprop, kAdagrad };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kAdam:
      return "Adam";
    case Kind::kAdamW:
      return "AdamW";
    case Kind::kSgd:
      return "SGD";
    case Kind::kRmsprop:
      return "RMSprop";
    case Kind::kAdagrad:
      return "Adagrad";
  }
  return "?";
}

// Two param groups with different lr; options chosen so that every state field is used
// (amsgrad, momentum, centered) and step counts matter (bias correction, lr_decay).
template <class Opt, class Options>
std::unique_ptr<optim::Optimizer> two_groups(Net& net, Options first, Options second) {
  std::vector<optim::OptimizerParamGroup> groups;
  groups.emplace_back(net->fc1->parameters(), std::make_unique<Options>(first));
  std::vector<torch::Tensor> rest = net->bn->parameters();
  for (const auto& p : net->fc2->parameters()) rest.push_back(p);
  groups.emplace_back(rest, std::make_unique<Options>(second));
  return std::make_unique<Opt>(std::move(groups), first);
}

std::unique_ptr<optim::Optimizer> make_optimizer(Kind kind, Net& net) {
  switch (kind) {
    case Kind::kAdam:
      return two_groups<optim::Adam>(net, optim::AdamOptions(1e-2).amsgrad(true).weight_decay(0.01),
                                     optim::AdamOptions(3e-3).betas(std::make_tuple(0.8, 0.99)));
    case Kind::kAdamW:
      return two_groups<optim::AdamW>(net, optim::AdamWOptions(1e-2), optim::AdamWOptions(2e-3));
    case Kind::kSgd:
      return two_groups<optim::SGD>(net, optim::SGDOptions(0.05).momentum(0.9).nesterov(true),
                                    optim::SGDOptions(0.02).momentum(0.5).dampening(0.1));
    case Kind::kRmsprop:
      return two_groups<optim::RMSprop>(net,
                                        optim::RMSpropOptions(1e-2).momentum(0.5).centered(true),
                                        optim::RMSpropOptions(5e-3));
    case Kind::kAdagrad:
      return two_groups<optim::Adagrad>(
          net, optim::AdagradOptions(0.1).lr_decay(0.05).initial_accumulator_value(0.1),
          optim::AdagradOptions(0.05));
  }
  return nullptr;
}

// User state with binary bytes (a NUL and a 0xff byte) that must arrive unchanged.
struct BytesExtension : StateExtension {
  std::string bytes;
  std::string save() const override { return bytes; }
  void load(std::string_view b) override { bytes = std::string(b); }
};

// One rank: a model, its optimizer, scalars and an extension, all tracked.
struct Side {
  Net net{nullptr};
  std::unique_ptr<optim::Optimizer> opt;
  StateRegistry reg;
  int64_t epoch = 0;
  double loss_scale = 1.0;
  std::shared_ptr<BytesExtension> ext = std::make_shared<BytesExtension>();

  Side(Kind kind, uint64_t seed, int64_t hidden = 16) {
    torch::manual_seed(seed);
    net = Net(hidden);
    opt = make_optimizer(kind, net);
    reg.track_module(*net);
    reg.track_optimizer(*opt);
    reg.track_scalar("epoch", &epoch);
    reg.track_scalar("loss_scale", &loss_scale);
    reg.track_extension("scheduler", ext);
  }

  // One training step on batch number `i` (the same data on every side).
  void step(int i) {
    torch::manual_seed(1000 + i);
    const auto x = torch::randn({6, 8});
    const auto y = torch::randn({6, 4});
    opt->zero_grad();
    torch::mse_loss(net->forward(x), y).backward();
    opt->step();
  }

  std::vector<torch::Tensor> module_tensors() const {
    std::vector<torch::Tensor> out;
    for (const auto& p : net->parameters()) out.push_back(p);
    for (const auto& b : net->buffers()) out.push_back(b);
    return out;
  }
};

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const auto ca = a.contiguous().cpu();
  const auto cb = b.contiguous().cpu();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

bool same_module_state(const Side& a, const Side& b) {
  const auto ta = a.module_tensors();
  const auto tb = b.module_tensors();
  if (ta.size() != tb.size()) return false;
  for (size_t i = 0; i < ta.size(); ++i) {
    if (!bitwise_equal(ta[i], tb[i])) return false;
  }
  return true;
}

// What a handoff does: the receiver takes the source's manifest, then every tensor is copied
// in canonical order (a broadcast, in the runtime).
void receive(const Side& source, Side& receiver) {
  receiver.reg.apply_manifest(source.reg.manifest(), torch::kCPU);
  const auto from = source.reg.tensors();
  const auto to = receiver.reg.tensors();
  REQUIRE(from.size() == to.size());
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < from.size(); ++i) {
    REQUIRE(from[i].sizes() == to[i].sizes());
    REQUIRE((from[i].scalar_type() == to[i].scalar_type()));
    to[i].copy_(from[i]);
  }
}

const Kind kAllKinds[] = {Kind::kAdam, Kind::kAdamW, Kind::kSgd, Kind::kRmsprop, Kind::kAdagrad};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The inode number of `path` (0 if there is none): a new file, or the same one rewritten.
uint64_t inode_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const StateError& e) {
    return e.what();
  }
  FAIL("no StateError was thrown");
  return {};
}

}  // namespace

TEST_CASE("state registry: a receiver gets the source's exact training state, per optimizer") {
  for (Kind kind : kAllKinds) {
    CAPTURE(kind_name(kind));
    Side source(kind, 1);
    for (int i = 0; i < 3; ++i) source.step(i);
    source.epoch = 7;
    source.loss_scale = 0.125;
    source.ext->bytes = std::string("sched\0\xff", 7);
    source.opt->param_groups()[1].options().set_lr(0.0123);  // as a scheduler would

    Side receiver(kind, 2);  // different init, fresh optimizer (no state yet, except Adagrad)
    CHECK_FALSE(same_module_state(source, receiver));
    CHECK(source.reg.checksum() != receiver.reg.checksum());

    receive(source, receiver);
    CHECK(receiver.reg.checksum() == source.reg.checksum());
    CHECK(receiver.reg.manifest() == source.reg.manifest());
    CHECK(receiver.reg.nbytes() == source.reg.nbytes());
    CHECK(receiver.opt->state().size() == source.opt->state().size());
    CHECK(receiver.opt->param_groups()[1].options().get_lr() == 0.0123);
    CHECK(receiver.epoch == 7);
    CHECK(receiver.loss_scale == 0.125);
    CHECK(receiver.ext->bytes == std::string("sched\0\xff", 7));

    // The state really moved (moments, step counts, options): the next step is bitwise equal.
    source.step(3);
    receiver.step(3);
    CHECK(same_module_state(source, receiver));
    CHECK(receiver.reg.checksum() == source.reg.checksum());

    // Control: copying only the module tensors is not enough, so the check above can fail.
    Side params_only(kind, 3);
    {
      torch::NoGradGuard no_grad;
      const auto from = source.module_tensors();
      const auto to = params_only.module_tensors();
      for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
    }
    source.step(4);
    params_only.step(4);
    CHECK_FALSE(same_module_state(source, params_only));
  }
}

TEST_CASE("state registry: a warm joiner's receive reserve is exactly the state it will get") {
  for (Kind kind : kAllKinds) {
    CAPTURE(kind_name(kind));
    Side source(kind, 1);
    for (int i = 0; i < 2; ++i) source.step(i);
    int64_t module_bytes = 0;
    for (const auto& t : source.module_tensors()) module_bytes += static_cast<int64_t>(t.nbytes());
    const int64_t optimizer_bytes = source.reg.nbytes() - module_bytes;
    REQUIRE(optimizer_bytes > 0);

    Side receiver(kind, 2);
    // Adagrad makes its state in its constructor: nothing is missing, nothing is reserved.
    const int64_t reserved = receiver.reg.reserve_receive(torch::kCPU);
    CHECK(reserved == (kind == Kind::kAdagrad ? 0 : optimizer_bytes));
    CHECK(receiver.opt->state().size() ==
          (kind == Kind::kAdagrad ? source.opt->state().size() : 0));
    receive(source, receiver);
    CHECK(receiver.reg.checksum() == source.reg.checksum());
    source.step(2);
    receiver.step(2);
    CHECK(same_module_state(source, receiver));
    CHECK(receiver.reg.checksum() == source.reg.checksum());
  }
  // SGD without momentum keeps no state: nothing to reserve.
  Side plain(Kind::kSgd, 3);
  for (auto& g : plain.opt->param_groups())
    static_cast<optim::SGDOptions&>(g.options()).momentum(0);
  CHECK(plain.reg.reserve_receive(torch::kCPU) == 0);
}

TEST_CASE("state registry: the manifest is deterministic and does not depend on values") {
  Side a(Kind::kAdam, 1);
  Side b(Kind::kAdam, 2);
  CHECK(a.reg.manifest() == b.reg.manifest());
  a.step(0);
  CHECK(a.reg.manifest() != b.reg.manifest());  // state entries and step counts appeared
  b.step(0);
  CHECK(a.reg.manifest() == b.reg.manifest());
  const auto m = a.reg.manifest();
  CHECK(m.find('\n') == std::string::npos);
  CHECK(m.find("\"model.fc1.weight\"") != std::string::npos);
  CHECK(m.find("\"max_exp_avg_sq\"") != std::string::npos);
}

TEST_CASE("state registry: canonical order is modules by name, then optimizer state") {
  Side s(Kind::kAdam, 1);
  s.step(0);
  const auto ts = s.reg.tensors();
  // 4 (fc1, fc2 weight+bias) + 2 (bn weight, bias) parameters, 3 bn buffers; then Adam with
  // amsgrad on group 0 (fc1: 3 fields each) and without on group 1 (2 fields each).
  REQUIRE(ts.size() == 9 + 2 * 3 + 4 * 2);
  // Sorted names: bn.bias, bn.num_batches_tracked, bn.running_mean, bn.running_var,
  // bn.weight, fc1.bias, fc1.weight, fc2.bias, fc2.weight.
  CHECK(ts[0].data_ptr() == s.net->bn->bias.data_ptr());
  CHECK((ts[1].scalar_type() == torch::kLong));
  CHECK(ts[1].dim() == 0);
  CHECK(ts[6].data_ptr() == s.net->fc1->weight.data_ptr());
  CHECK(ts[8].data_ptr() == s.net->fc2->weight.data_ptr());
  // Optimizer state follows parameter order: fc1.weight's exp_avg first.
  const auto& st = static_cast<const optim::AdamParamState&>(
      *s.opt->state().begin()->second);  // any entry: all are AdamParamState
  CHECK(st.exp_avg().defined());
  CHECK(ts[9].sizes() == s.net->fc1->weight.sizes());
  // References, not copies: writing into tensors() changes the model.
  ts[6].fill_(3.0F);
  CHECK(s.net->fc1->weight.min().item<float>() == 3.0F);
  int64_t total = 0;
  for (const auto& t : ts) total += static_cast<int64_t>(t.nbytes());
  CHECK(s.reg.nbytes() == total);
}

TEST_CASE("state registry: checksum is bitwise sensitive") {
  Side s(Kind::kAdam, 1);
  for (int i = 0; i < 2; ++i) s.step(i);
  const uint64_t base = s.reg.checksum();
  CHECK(s.reg.checksum() == base);  // stable

  SUBCASE("one bit of one parameter element") {
    auto* words = static_cast<uint32_t*>(s.net->fc2->weight.data_ptr());
    words[5] ^= 1U << 0;
    CHECK(s.reg.checksum() != base);
    words[5] ^= 1U << 0;
    CHECK(s.reg.checksum() == base);
  }
  SUBCASE("one bit of the int64 batch counter") {
    auto* counter = s.net->bn->num_batches_tracked.data_ptr<int64_t>();
    *counter ^= int64_t{1} << 40;
    CHECK(s.reg.checksum() != base);
  }
  SUBCASE("two elements swapped") {
    auto w = s.net->fc1->weight.detach().view({-1});
    float* p = w.data_ptr<float>();
    REQUIRE(p[2] != p[9]);
    std::swap(p[2], p[9]);
    CHECK(s.reg.checksum() != base);
    std::swap(p[2], p[9]);
    CHECK(s.reg.checksum() == base);
  }
  SUBCASE("two optimizer-state elements swapped") {
    const auto ts = s.reg.tensors();
    float* p = ts.back().data_ptr<float>();
    REQUIRE(ts.back().numel() > 3);
    REQUIRE(p[0] != p[3]);
    std::swap(p[0], p[3]);
    CHECK(s.reg.checksum() != base);
  }
  SUBCASE("a step count") {
    auto& st = static_cast<optim::AdamParamState&>(*s.opt->state().begin()->second);
    st.step(st.step() + 1);
    CHECK(s.reg.checksum() != base);
  }
  SUBCASE("a learning rate") {
    auto& o = s.opt->param_groups()[0].options();
    o.set_lr(std::nextafter(o.get_lr(), 1.0));
    CHECK(s.reg.checksum() != base);
  }
  SUBCASE("a scalar") {
    s.epoch += 1;
    CHECK(s.reg.checksum() != base);
    s.epoch -= 1;
    s.loss_scale = -s.loss_scale;
    CHECK(s.reg.checksum() != base);
  }
}

TEST_CASE("state registry: release frees everything; materialize and a new handoff restore it") {
  for (Kind kind : {Kind::kAdam, Kind::kAdagrad}) {
    CAPTURE(kind_name(kind));
    Side source(kind, 1);
    Side rank(kind, 2);
    for (int i = 0; i < 2; ++i) {
      source.step(i);
      rank.step(i);
    }
    const auto param_impl = rank.net->fc1->weight.unsafeGetTensorImpl();
    std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> storages;
    for (const auto& t : rank.reg.tensors()) storages.push_back(t.storage().getWeakStorageImpl());
    REQUIRE(rank.net->fc1->weight.grad().defined());

    rank.reg.release();
    CHECK(rank.reg.tensors().empty());
    CHECK(rank.reg.nbytes() == 0);
    CHECK(rank.opt->state().empty());
    for (const auto& t : rank.module_tensors()) CHECK(t.storage().nbytes() == 0);
    CHECK_FALSE(rank.net->fc1->weight.grad().defined());
    for (const auto& w : storages) CHECK(w.expired());  // nothing pins the old memory
    CHECK_THROWS_AS(rank.reg.manifest(), StateError);
    CHECK_THROWS_AS(rank.reg.checksum(), StateError);

    rank.reg.materialize(torch::kCPU);
    CHECK(rank.net->fc1->weight.sizes() == torch::IntArrayRef({16, 8}));
    CHECK(rank.net->fc1->weight.unsafeGetTensorImpl() == param_impl);  // identity kept
    CHECK(rank.net->fc1->weight.requires_grad());

    receive(source, rank);
    CHECK(rank.reg.checksum() == source.reg.checksum());
    source.step(5);
    rank.step(5);
    CHECK(same_module_state(source, rank));
  }
}

TEST_CASE("state registry: apply_manifest on a released rank allocates by itself") {
  Side source(Kind::kRmsprop, 1);
  source.step(0);
  Side rank(Kind::kRmsprop, 2);
  rank.reg.release();
  receive(source, rank);  // no materialize(): apply_manifest gives every tensor storage
  CHECK(rank.reg.checksum() == source.reg.checksum());
}

TEST_CASE("state registry: entries the source does not have are removed on the receiver") {
  Side source(Kind::kSgd, 1);  // fresh: no momentum buffers yet
  Side receiver(Kind::kSgd, 2);
  receiver.step(0);
  REQUIRE_FALSE(receiver.opt->state().empty());
  receive(source, receiver);
  CHECK(receiver.opt->state().empty());
  CHECK(receiver.reg.checksum() == source.reg.checksum());
  source.step(1);
  receiver.step(1);
  CHECK(same_module_state(source, receiver));
}

TEST_CASE("state registry: snapshot round trip") {
  gpurun::testing::TempDir dir("gpurun-state");
  const std::string path = (dir.path / "state.snap").string();
  for (Kind kind : kAllKinds) {
    CAPTURE(kind_name(kind));
    Side source(kind, 1);
    for (int i = 0; i < 3; ++i) source.step(i);
    source.epoch = 4;
    source.ext->bytes = "extension bytes";
    source.reg.write_snapshot(path);
    CHECK(std::filesystem::file_size(path) >= static_cast<uintmax_t>(source.reg.nbytes()));
    for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
      CHECK(e.path().filename() == "state.snap");  // no temporary left behind
    }

    Side restored(kind, 2);
    restored.reg.release();  // a paused rank
    restored.reg.read_snapshot(path, torch::kCPU);
    CHECK(restored.reg.checksum() == source.reg.checksum());
    CHECK(restored.epoch == 4);
    CHECK(restored.ext->bytes == "extension bytes");
    source.step(3);
    restored.step(3);
    CHECK(same_module_state(source, restored));
  }
}

TEST_CASE("state registry: damaged snapshots and mismatched models fail with clear errors") {
  gpurun::testing::TempDir dir("gpurun-state");
  const std::string path = (dir.path / "state.snap").string();
  Side source(Kind::kAdam, 1);
  source.step(0);
  source.reg.write_snapshot(path);
  const std::string good = read_file(path);
  Side receiver(Kind::kAdam, 2);

  SUBCASE("truncated") {
    write_file(path, good.substr(0, good.size() - 100));
    const auto msg = error_of([&] { receiver.reg.read_snapshot(path, torch::kCPU); });
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find("truncated") != std::string::npos);
    write_file(path, good.substr(0, 10));
    CHECK(error_of([&] { receiver.reg.read_snapshot(path, torch::kCPU); }).find("truncated") !=
          std::string::npos);
  }
  SUBCASE("a changed manifest byte") {
    std::string bad = good;
    bad[gpurun::snapshot::SnapshotHeader::kBytes + 3] ^= 0x01;
    write_file(path, bad);
    const auto msg = error_of([&] { receiver.reg.read_snapshot(path, torch::kCPU); });
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find("corrupt") != std::string::npos);
  }
  SUBCASE("wrong magic") {
    std::string bad = good;
    bad[0] = 'X';
    write_file(path, bad);
    const auto msg = error_of([&] { receiver.reg.read_snapshot(path, torch::kCPU); });
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find("magic") != std::string::npos);
  }
  SUBCASE("missing file") {
    std::string msg;
    try {
      receiver.reg.read_snapshot(path + ".nope", torch::kCPU);
    } catch (const gpurun::Error& e) {
      msg = e.what();
    }
    CHECK(msg.find(path + ".nope") != std::string::npos);
  }
  SUBCASE("a model with a different shape") {
    Side wider(Kind::kAdam, 2, /*hidden=*/17);
    const auto before = wider.reg.checksum();
    const auto msg = error_of([&] { wider.reg.read_snapshot(path, torch::kCPU); });
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find("model.bn.bias") != std::string::npos);  // the first mismatch by name
    CHECK(msg.find("[16]") != std::string::npos);
    CHECK(msg.find("[17]") != std::string::npos);
    CHECK(wider.reg.checksum() == before);  // nothing was changed
    const auto direct =
        error_of([&] { wider.reg.apply_manifest(source.reg.manifest(), torch::kCPU); });
    CHECK(direct.find("model.bn.bias") != std::string::npos);
  }
  SUBCASE("another optimizer type") {
    Side sgd(Kind::kSgd, 2);
    const auto msg = error_of([&] { sgd.reg.apply_manifest(source.reg.manifest(), torch::kCPU); });
    CHECK(msg.find("Adam") != std::string::npos);
    CHECK(msg.find("SGD") != std::string::npos);
  }
  SUBCASE("not a manifest") {
    CHECK(error_of([&] {
            receiver.reg.apply_manifest("{\"format\":", torch::kCPU);
          }).find("malformed") != std::string::npos);
  }
}

TEST_CASE("state registry: unsupported optimizers and bad tracking fail loudly") {
  torch::manual_seed(0);
  Net net;
  StateRegistry reg;
  reg.track_module(*net);
  optim::LBFGS lbfgs(net->parameters());
  const auto msg = error_of([&] { reg.track_optimizer(lbfgs); });
  CHECK(msg.find("LBFGS") != std::string::npos);

  CHECK_THROWS_AS(reg.track_module(*net), StateError);  // same prefix twice
  CHECK(error_of([&] { reg.track_module(*net, "again"); }).find("already tracked") !=
        std::string::npos);

  Net other;
  optim::SGD untracked(other->parameters(), optim::SGDOptions(0.1));
  CHECK(error_of([&] { reg.track_optimizer(untracked); }).find("does not belong") !=
        std::string::npos);

  int64_t a = 0;
  double b = 0;
  reg.track_scalar("x", &a);
  CHECK_THROWS_AS(reg.track_scalar("x", &b), StateError);
  CHECK_THROWS_AS(reg.track_extension("x", std::make_shared<BytesExtension>()), StateError);
}

TEST_CASE("state registry: scalars and extensions must match by name and type") {
  Side source(Kind::kAdam, 1);
  StateRegistry other;
  torch::manual_seed(3);
  Net net;
  auto opt = make_optimizer(Kind::kAdam, net);
  other.track_module(*net);
  other.track_optimizer(*opt);
  double epoch_as_double = 0;  // same name, other type
  double loss_scale = 0;
  other.track_scalar("epoch", &epoch_as_double);
  other.track_scalar("loss_scale", &loss_scale);
  other.track_extension("scheduler", std::make_shared<BytesExtension>());
  CHECK(error_of([&] { other.apply_manifest(source.reg.manifest(), torch::kCPU); }).find("epoch") !=
        std::string::npos);
}

TEST_CASE(
    "state registry: repeated snapshots are written in place into one file and read back exactly") {
  gpurun::testing::TempDir dir("gpurun-state");
  const std::string path = (dir.path / "state.snap").string();
  Side source(Kind::kAdamW, 1);
  source.step(0);
  source.reg.write_snapshot(path);
  CHECK(source.reg.last_snapshot_stats().created);
  const uint64_t inode = inode_of(path);
  const auto file_bytes = std::filesystem::file_size(path);
  for (int i = 1; i <= 3; ++i) {
    CAPTURE(i);
    source.step(i);
    source.epoch = i;
    source.ext->bytes = std::string(static_cast<size_t>(i) * 300, 'x');  // the manifest grows
    source.reg.write_snapshot(path);
    const auto& st = source.reg.last_snapshot_stats();
    CHECK(!st.created);  // no new file, no new mapping: only copies
    CHECK(!st.mapped);
    CHECK(st.tensor_bytes == source.reg.nbytes());
    CHECK(inode_of(path) == inode);
    CHECK(std::filesystem::file_size(path) == file_bytes);

    Side restored(Kind::kAdamW, 2);
    restored.reg.read_snapshot(path, torch::kCPU);
    CHECK(restored.reg.last_snapshot_stats().mapped);
    CHECK(restored.reg.checksum() == source.reg.checksum());
    CHECK(restored.epoch == i);
    CHECK(restored.ext->bytes == source.ext->bytes);
    CHECK(same_module_state(source, restored));
  }
  // Hold mode: the writer releases its state and reads it back from the mapping it kept.
  const uint64_t before = source.reg.checksum();
  source.reg.release();
  source.reg.read_snapshot(path, torch::kCPU);
  CHECK(!source.reg.last_snapshot_stats().mapped);
  CHECK(source.reg.checksum() == before);
  source.step(9);
  source.reg.write_snapshot(path);
  CHECK(inode_of(path) == inode);
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
    CHECK(e.path().filename() == "state.snap");  // no temporary left behind
  }
}

TEST_CASE("state registry: a snapshot interrupted before its commit is refused") {
  using gpurun::snapshot::SnapshotFile;
  using gpurun::snapshot::SnapshotHeader;
  gpurun::testing::TempDir dir("gpurun-state");
  const std::string path = (dir.path / "state.snap").string();
  Side source(Kind::kAdam, 1);
  source.step(0);
  source.reg.write_snapshot(path);  // snapshot #1, committed
  source.step(1);

  // What write_snapshot does up to its copies, by a writer that dies before committing: the
  // committed snapshot #1 must not be read as valid either (its bytes are being overwritten).
  {
    SnapshotFile file = SnapshotFile::open(path);
    std::vector<uint64_t> sizes, offsets;
    for (const auto& t : source.reg.tensors()) sizes.push_back(t.nbytes());
    const std::string manifest = source.reg.manifest();
    file.begin(SnapshotHeader::plan(manifest.size(), sizes, offsets), manifest);
  }
  Side receiver(Kind::kAdam, 2);
  const uint64_t untouched = receiver.reg.checksum();
  const auto msg = error_of([&] { receiver.reg.read_snapshot(path, torch::kCPU); });
  CHECK(msg.find(path) != std::string::npos);
  CHECK(msg.find("incomplete") != std::string::npos);
  CHECK(msg.find("pid " + std::to_string(::getpid())) != std::string::npos);
  CHECK(msg.find("snapshot #2") != std::string::npos);
  CHECK(receiver.reg.checksum() == untouched);  // nothing was applied

  // The next complete write is valid again.
  source.reg.write_snapshot(path);
  receiver.reg.read_snapshot(path, torch::kCPU);
  CHECK(receiver.reg.checksum() == source.reg.checksum());
}

TEST_CASE("state registry: a much larger or smaller state re-creates the snapshot file") {
  gpurun::testing::TempDir dir("gpurun-state");
  const std::string path = (dir.path / "state.snap").string();
  Side small(Kind::kAdam, 1);
  small.step(0);
  Side large(Kind::kAdam, 1, /*hidden=*/4096);
  large.step(0);

  small.reg.write_snapshot(path);
  const uint64_t small_inode = inode_of(path);
  const auto small_bytes = std::filesystem::file_size(path);

  large.reg.write_snapshot(path);  // does not fit the small file
  CHECK(large.reg.last_snapshot_stats().created);
  CHECK(inode_of(path) != small_inode);
  const auto large_bytes = std::filesystem::file_size(path);
  CHECK(large_bytes > small_bytes);
  CHECK(large_bytes >= static_cast<uintmax_t>(large.reg.nbytes()));
  Side large_copy(Kind::kAdam, 2, 4096);
  large_copy.reg.read_snapshot(path, torch::kCPU);
  CHECK(large_copy.reg.checksum() == large.reg.checksum());

  small.reg.write_snapshot(path);  // its old file was replaced; the large one is far too big
  CHECK(small.reg.last_snapshot_stats().created);
  CHECK(std::filesystem::file_size(path) == small_bytes);
  Side small_copy(Kind::kAdam, 2);
  small_copy.reg.read_snapshot(path, torch::kCPU);
  CHECK(small_copy.reg.checksum() == small.reg.checksum());

  large.reg.write_snapshot(path);  // its kept mapping is of a replaced file: a new one again
  CHECK(large.reg.last_snapshot_stats().created);
  large_copy.reg.read_snapshot(path, torch::kCPU);
  CHECK(large_copy.reg.checksum() == large.reg.checksum());
}

TEST_CASE("state registry: prepare_snapshot maps ahead and never replaces an existing file") {
  gpurun::testing::TempDir dir("gpurun-state");
  const std::string path = (dir.path / "state.snap").string();
  Side source(Kind::kAdam, 1);
  source.step(0);
  source.reg.prepare_snapshot(path);
  CHECK(source.reg.last_snapshot_stats().created);
  CHECK(std::filesystem::file_size(path) >= static_cast<uintmax_t>(source.reg.nbytes()));
  Side receiver(Kind::kAdam, 2);
  CHECK(error_of([&] { receiver.reg.read_snapshot(path, torch::kCPU); }).find("no snapshot yet") !=
        std::string::npos);

  const uint64_t inode = inode_of(path);
  source.reg.write_snapshot(path);  // only copies
  CHECK(!source.reg.last_snapshot_stats().created);
  CHECK(!source.reg.last_snapshot_stats().mapped);
  CHECK(inode_of(path) == inode);

  // Another rank prepares the same path: it maps the file and leaves the snapshot in it.
  Side other(Kind::kAdam, 3);
  other.step(0);
  other.reg.prepare_snapshot(path);
  CHECK(!other.reg.last_snapshot_stats().created);
  CHECK(other.reg.last_snapshot_stats().mapped);
  // A state that does not fit leaves the file alone (the first write will replace it).
  Side large(Kind::kAdam, 1, /*hidden=*/4096);
  large.step(0);
  large.reg.prepare_snapshot(path);
  CHECK(!large.reg.last_snapshot_stats().created);
  CHECK(large.reg.last_snapshot_stats().file_bytes == 0);
  CHECK(inode_of(path) == inode);
  receiver.reg.read_snapshot(path, torch::kCPU);
  CHECK(receiver.reg.checksum() == source.reg.checksum());
}

TEST_CASE("state registry: a standby's early mapping is pinned at its go unless the file changed") {
  namespace snap = gpurun::snapshot;
  gpurun::testing::TempDir dir("gpurun-state");
  const std::string path = (dir.path / "state.snap").string();
  Side source(Kind::kAdam, 1);
  source.step(0);
  source.reg.write_snapshot(path);  // a paused job's snapshot

  int pins = 0;  // a fake cudaHostRegister: counts the ranges it page-locks
  struct FakePin : snap::HostPin {
    void leave_to_exit() noexcept override {}
  };
  snap::set_host_pinner([&pins](uint8_t*, size_t, bool) -> std::unique_ptr<snap::HostPin> {
    ++pins;
    return std::make_unique<FakePin>();
  });
  struct Unpinner {
    ~Unpinner() { snap::set_host_pinner({}); }
  } unpinner;

  StateRegistry::SnapshotPreparation plan;  // what the runtime's start_premap plans
  plan.paths = {path};
  REQUIRE(snap::SnapshotHeader::peek_sizes(path, plan.data_end, plan.manifest_bytes));
  plan.file_bytes = snap::snapshot_file_bytes(plan.data_end, plan.manifest_bytes);

  // While it waits (no device): mapped, not pinned. After its go: the same mapping, pinned.
  StateRegistry::PreparedSnapshot early = StateRegistry::make_prepared_snapshot(plan);
  REQUIRE(early.file);
  CHECK(pins == 0);
  const snap::SnapshotFile* mapped = early.file.get();
  plan.on_device = true;
  StateRegistry::PreparedSnapshot done = snap::finish_prepared_snapshot(std::move(early), plan);
  CHECK(done.file.get() == mapped);
  CHECK(pins == 1);
  CHECK(done.stats.pinned);
  Side receiver(Kind::kAdam, 2);
  receiver.reg.adopt_prepared_snapshot(std::move(done));
  receiver.reg.read_snapshot(path, torch::kCPU);
  CHECK(receiver.reg.checksum() == source.reg.checksum());

  // The file was replaced while it waited (another pause wrote a new one): the old mapping is
  // dropped, the new file is mapped and pinned, and the read gets the new state.
  plan.on_device = false;
  StateRegistry::PreparedSnapshot stale = StateRegistry::make_prepared_snapshot(plan);
  REQUIRE(stale.file);
  const snap::SnapshotFile* old_mapping = stale.file.get();
  source.step(1);
  const std::string fresh = (dir.path / "fresh.snap").string();
  source.reg.write_snapshot(fresh);
  std::filesystem::rename(fresh, path);
  plan.on_device = true;
  StateRegistry::PreparedSnapshot redone = snap::finish_prepared_snapshot(std::move(stale), plan);
  REQUIRE(redone.file);
  CHECK(redone.file.get() != old_mapping);
  CHECK(redone.file->is_at(path));
  CHECK(pins == 2);
  Side late(Kind::kAdam, 3);
  late.reg.adopt_prepared_snapshot(std::move(redone));
  late.reg.read_snapshot(path, torch::kCPU);
  CHECK(late.reg.checksum() == source.reg.checksum());
}

// ---- snapshot integrity and fallback (a full /dev/shm; a corrupt file) -----------------------

namespace {

using gpurun::rt::SnapshotPaths;
using gpurun::snapshot::SnapshotHeader;

// The two calls of the runtime at a pause and at its resume.
std::string write_to(const StateRegistry& reg, const SnapshotPaths& paths) {
  return reg.write_snapshot(paths);
}
std::string read_from(StateRegistry& reg, const SnapshotPaths& paths) {
  return reg.read_snapshot(paths, torch::kCPU);
}

uint64_t u64_at(const std::string& bytes, size_t at) {
  uint64_t v = 0;
  std::memcpy(&v, bytes.data() + at, sizeof v);
  return v;
}

std::vector<std::string> names_in(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Runs `f` in a forked child whose files may grow to at most `max_file_bytes`
// (RLIMIT_FSIZE; SIGXFSZ ignored, so a larger file fails with EFBIG: a "full disk" without
// root). f returns the child's exit code; `report` gets what f wrote there. Returns the exit
// code (-1: the child did not exit normally).
int in_child_with_file_limit(uint64_t max_file_bytes, const std::string& report,
                             const std::function<int(std::ofstream&)>& f) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::ofstream out(report);
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{max_file_bytes, max_file_bytes};
    int code = 90;
    if (::setrlimit(RLIMIT_FSIZE, &limit) == 0) {
      try {
        code = f(out);
      } catch (const std::exception& e) {
        out << "unexpected exception: " << e.what();
        code = 91;
      }
    }
    out.close();
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A small tmpfs mounted at `dir` (root only: without the privilege the test says so and
// skips), unmounted at the end.
struct SmallTmpfs {
  std::filesystem::path dir;
  bool mounted = false;
  SmallTmpfs(const std::filesystem::path& at, const std::string& size) : dir(at) {
    std::filesystem::create_directories(dir);
    mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
    if (!mounted) MESSAGE("skipped: cannot mount a tmpfs here: " << std::strerror(errno));
  }
  ~SmallTmpfs() {
    if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
  }
};

}  // namespace

TEST_CASE("state registry: a snapshot too large for the primary path falls back to the second") {
  // The user's bug: /dev/shm too small for the state, the pause lost it. Here the primary is
  // refused by RLIMIT_FSIZE (checked before the reservation, which would raise SIGXFSZ) in a
  // child process; the fallback file was prepared before (the write reuses it in place,
  // needing no new space).
  gpurun::testing::TempDir dir("gpurun-state");
  const SnapshotPaths paths{(dir.path / "shm.snapshot").string(),
                            (dir.path / "state.snapshot").string()};
  Side source(Kind::kAdam, 1);
  source.step(0);
  source.epoch = 7;
  {
    Side preparer(Kind::kAdam, 1);
    preparer.step(0);
    preparer.reg.prepare_snapshot(paths.fallback);
  }
  REQUIRE(std::filesystem::exists(paths.fallback));
  gpurun::testing::TempDir out("gpurun-report");
  const std::string report = (out.path / "report").string();
  const int code = in_child_with_file_limit(4096, report, [&](std::ofstream& o) {
    const std::string used = write_to(source.reg, paths);
    o << used << "\n";
    for (const auto& a : source.reg.last_snapshot_stats().failed_attempts) o << a << "\n";
    return used == paths.fallback ? 0 : 1;
  });
  const std::string said = read_file(report);
  INFO("child: " << said);
  CHECK(code == 0);
  CHECK(said.find("'" + paths.primary + "'") != std::string::npos);  // the failed attempt
  CHECK(said.find("RLIMIT_FSIZE (ulimit -f) is 4 KiB") != std::string::npos);
  // Only the verified snapshot at the fallback remains: no partial primary, no temporary.
  CHECK(names_in(dir.path) == std::vector<std::string>{"state.snapshot"});

  Side restored(Kind::kAdam, 2);
  restored.reg.release();
  CHECK(read_from(restored.reg, paths) == paths.fallback);
  CHECK(restored.reg.checksum() == source.reg.checksum());
  CHECK(restored.epoch == 7);
  CHECK(same_module_state(source, restored));
}

TEST_CASE("state registry: with no room at any path the write fails once, listing every attempt") {
  gpurun::testing::TempDir dir("gpurun-state");
  const SnapshotPaths paths{(dir.path / "shm.snapshot").string(),
                            (dir.path / "state.snapshot").string()};
  Side source(Kind::kAdam, 1);
  source.step(0);
  source.reg.write_snapshot(paths.primary);  // an old snapshot there: it must not survive
  (void)source.reg.close_snapshot();  // no kept mapping: an in-place write would need no new space
  std::filesystem::resize_file(paths.primary, 4096);  // ... and the old file does not fit
  source.step(1);
  gpurun::testing::TempDir out("gpurun-report");
  const std::string report = (out.path / "report").string();
  const int code = in_child_with_file_limit(4096, report, [&](std::ofstream& o) {
    const uint64_t before = source.reg.checksum();
    try {
      write_to(source.reg, paths);
    } catch (const StateError& e) {
      o << e.what();
      return source.reg.checksum() == before ? 0 : 3;  // the state in memory is untouched
    } catch (const gpurun::Error& e) {
      o << "not a StateError: " << e.what();
      return 2;
    }
    return 1;
  });
  const std::string msg = read_file(report);
  INFO("child: " << msg);
  CHECK(code == 0);
  CHECK(msg.find("every path failed") != std::string::npos);
  CHECK(msg.find("(1) '" + paths.primary + "'") != std::string::npos);
  CHECK(msg.find("(2) '" + paths.fallback + "'") != std::string::npos);
  CHECK(msg.find("RLIMIT_FSIZE (ulimit -f) is 4 KiB, below the pause snapshot's") !=
        std::string::npos);           // with the bytes it needed
  CHECK(names_in(dir.path).empty());  // no partial or stale file anywhere
}

TEST_CASE("state registry: a full tmpfs (ENOSPC) falls back; prepare too; no room anywhere") {
  gpurun::testing::TempDir dir("gpurun-state");
  SmallTmpfs shm(dir.path / "shm", "1m");
  if (!shm.mounted) return;
  const SnapshotPaths paths{(shm.dir / "x.snapshot").string(),
                            (dir.path / "state.snapshot").string()};
  Side source(Kind::kAdam, 1, /*hidden=*/8192);  // about 2.3 MB of state after a step
  source.step(0);
  REQUIRE(source.reg.nbytes() > (1 << 20));

  SUBCASE("write") {
    CHECK(write_to(source.reg, paths) == paths.fallback);
    const auto& st = source.reg.last_snapshot_stats();
    CHECK(st.path == paths.fallback);
    REQUIRE(st.failed_attempts.size() == 1);
    CHECK(st.failed_attempts[0].find(std::strerror(ENOSPC)) != std::string::npos);
    CHECK(names_in(shm.dir).empty());  // the partial primary was removed
    Side restored(Kind::kAdam, 2, 8192);
    CHECK(read_from(restored.reg, paths) == paths.fallback);
    CHECK(restored.reg.checksum() == source.reg.checksum());
  }
  SUBCASE("prepare") {
    source.reg.prepare_snapshot(paths);
    CHECK(source.reg.last_snapshot_stats().path == paths.fallback);
    CHECK(source.reg.last_snapshot_stats().created);
    CHECK(names_in(shm.dir).empty());
    CHECK(write_to(source.reg, paths) == paths.fallback);
    CHECK_FALSE(source.reg.last_snapshot_stats().created);  // only copied
  }
  SUBCASE("both paths on the full tmpfs") {
    const SnapshotPaths full{paths.primary, (shm.dir / "y.snapshot").string()};
    const auto msg = error_of([&] { write_to(source.reg, full); });
    CHECK(msg.find("(1) '" + full.primary + "'") != std::string::npos);
    CHECK(msg.find("(2) '" + full.fallback + "'") != std::string::npos);
    CHECK(msg.find(std::strerror(ENOSPC)) != std::string::npos);
    CHECK(names_in(shm.dir).empty());
  }
}

/// A source's snapshot at `path` after one step, its bytes and header.
struct WrittenSnapshot {
  gpurun::testing::TempDir dir{"gpurun-state"};
  std::string path = (dir.path / "state.snap").string();
  Side source{Kind::kAdam, 1};
  std::string good;
  SnapshotHeader h;
  WrittenSnapshot() {
    source.step(0);
    source.reg.write_snapshot(path);
    good = read_file(path);
    h = SnapshotHeader::decode(reinterpret_cast<const uint8_t*>(good.data()), good.size(), path);
  }
};

TEST_CASE("state registry: a changed payload byte is refused and nothing is applied") {
  WrittenSnapshot w;
  const std::string& path = w.path;
  const std::string& good = w.good;
  const SnapshotHeader& h = w.h;
  Side& source = w.source;
  Side receiver(Kind::kAdam, 2);
  const uint64_t untouched = receiver.reg.checksum();
  // 8 bytes overwritten in the middle of the tensors (the user's report), and one bit.
  for (const uint64_t at : {(h.data_offset + h.data_end) / 2, h.data_end - 1}) {
    CAPTURE(at);
    std::string bad = good;
    if (at + 8 <= h.data_end) {
      std::memcpy(bad.data() + at, "GARBAGE!", 8);
    } else {
      bad[at] ^= 0x01;
    }
    write_file(path, bad);
    const auto msg = error_of([&] { receiver.reg.read_snapshot(path, torch::kCPU); });
    CHECK(msg.find("'" + path + "'") != std::string::npos);
    CHECK(msg.find("payload checksum 0x") != std::string::npos);
    CHECK(msg.find("!= header 0x") != std::string::npos);
    CHECK(msg.find("(file corrupt") != std::string::npos);
    CHECK(receiver.reg.checksum() == untouched);
  }
  write_file(path, good);
  receiver.reg.read_snapshot(path, torch::kCPU);
  CHECK(receiver.reg.checksum() == source.reg.checksum());
}

TEST_CASE("state registry: verified while copying, a changed payload byte leaves nothing usable") {
  // Verify::kWhileCopying (a rank resuming a paused job holds no state): the copies run
  // before the payload checksum is known, so a corrupt file must leave the tensors released.
  WrittenSnapshot w;
  const std::string& path = w.path;
  const std::string& good = w.good;
  const SnapshotHeader& h = w.h;
  Side& source = w.source;
  std::string bad = good;
  std::memcpy(bad.data() + (h.data_offset + h.data_end) / 2, "GARBAGE!", 8);
  write_file(path, bad);
  Side receiver(Kind::kAdam, 2);
  const auto while_copying = StateRegistry::Verify::kWhileCopying;
  const auto msg = error_of([&] {
    receiver.reg.read_snapshot(SnapshotPaths{path, {}}, torch::kCPU, while_copying);
  });
  CHECK(msg.find("'" + path + "'") != std::string::npos);
  CHECK(msg.find("payload checksum 0x") != std::string::npos);
  CHECK(msg.find("(file corrupt") != std::string::npos);
  CHECK(receiver.reg.tensors().empty());  // released: the copied bytes are gone
  CHECK(error_of([&] { (void)receiver.reg.checksum(); }).find("release") != std::string::npos);
  // The good file: the same state as the source's, and the same stats as a verify-first read.
  write_file(path, good);
  receiver.reg.read_snapshot(SnapshotPaths{path, {}}, torch::kCPU, while_copying);
  CHECK(receiver.reg.checksum() == source.reg.checksum());
  CHECK(receiver.reg.last_snapshot_stats().checksum_seconds > 0);
}

TEST_CASE("state registry: a truncated snapshot or another format version is refused clearly") {
  gpurun::testing::TempDir dir("gpurun-state");
  const std::string path = (dir.path / "state.snap").string();
  Side source(Kind::kAdam, 1);
  source.step(0);
  source.reg.write_snapshot(path);
  const std::string good = read_file(path);
  Side receiver(Kind::kAdam, 2);

  SUBCASE("truncated to half") {
    write_file(path, good.substr(0, good.size() / 2));
    const auto msg = error_of([&] { receiver.reg.read_snapshot(path, torch::kCPU); });
    CHECK(msg.find("'" + path + "' is truncated: " + std::to_string(good.size() / 2) + " of " +
                   std::to_string(good.size()) + " bytes") != std::string::npos);
  }
  SUBCASE("version 3 (the format with a one-stream payload checksum)") {
    std::string old = good;
    const uint32_t v3 = 3;
    std::memcpy(old.data() + 8, &v3, sizeof v3);
    write_file(path, old);
    const auto msg = error_of([&] { receiver.reg.read_snapshot(path, torch::kCPU); });
    CHECK(msg.find("'" + path + "' has format version 3") != std::string::npos);
    CHECK(msg.find("reads only version 4") != std::string::npos);
    CHECK(msg.find("older gpurun") != std::string::npos);
  }
  SUBCASE("a changed header field") {
    std::string bad = good;
    bad[64] ^= 0x10;  // writer_pid: not used by the reader, but the header checksum covers it
    write_file(path, bad);
    CHECK(error_of([&] {
            receiver.reg.read_snapshot(path, torch::kCPU);
          }).find("header checksum") != std::string::npos);
  }
}

TEST_CASE("state registry: the header records the payload size and checksum; bit-exact trip") {
  gpurun::testing::TempDir dir("gpurun-state");
  const std::string path = (dir.path / "state.snap").string();
  for (Kind kind : kAllKinds) {
    CAPTURE(kind_name(kind));
    Side source(kind, 1);
    for (int i = 0; i < 2; ++i) source.step(i);
    source.reg.write_snapshot(path);
    const std::string bytes = read_file(path);
    const uint64_t data_end = u64_at(bytes, 40);
    CHECK(u64_at(bytes, 8) % (uint64_t{1} << 32) == 4);  // version
    CHECK(u64_at(bytes, 80) == data_end - 128);          // payload_bytes
    CHECK(u64_at(bytes, 88) ==
          gpurun::snapshot::payload_digest(reinterpret_cast<const uint8_t*>(bytes.data()) + 128,
                                           data_end - 128));  // payload_checksum
    Side restored(kind, 2);
    restored.reg.release();
    restored.reg.read_snapshot(path, torch::kCPU);
    const auto a = source.reg.tensors(), b = restored.reg.tensors();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) CHECK(bitwise_equal(a[i], b[i]));
    CHECK(restored.reg.manifest() == source.reg.manifest());
  }
}

TEST_CASE("state registry: the writer's device memory is a header hint outside its checksum") {
  WrittenSnapshot w;
  // A CPU state: its writer holds no device memory, so no hint (bytes 112..119 zero).
  CHECK(u64_at(w.good, 112) == 0);
  CHECK(w.h.device_reserved_bytes == 0);
  CHECK(w.source.reg.last_snapshot_stats().device_reserved_hint == 0);
  // A header that records one: encoded at byte 112, decoded back, and not covered by the
  // header checksum (a file of before the hint, with zero there, still decodes).
  SnapshotHeader with = w.h;
  with.committed = true;
  with.device_reserved_bytes = (uint64_t{17} << 30) + 12345;
  std::string bytes = w.good;
  with.encode(reinterpret_cast<uint8_t*>(bytes.data()));
  CHECK(u64_at(bytes, 112) == with.device_reserved_bytes);
  CHECK(bytes.substr(0, 104) == w.good.substr(0, 104));  // same header checksum input
  write_file(w.path, bytes);
  Side restored(Kind::kAdam, 2);
  restored.reg.release();
  restored.reg.read_snapshot({w.path, ""}, torch::kCPU,
                             gpurun::rt::StateRegistry::Verify::kWhileCopying,
                             /*reserve_ahead=*/true);
  const auto& st = restored.reg.last_snapshot_stats();
  CHECK(st.device_reserved_hint == with.device_reserved_bytes);
  CHECK(st.reserved_ahead_bytes == 0);  // nothing on a device to reserve for
  CHECK(st.reserve_note.empty());
  const auto a = w.source.reg.tensors(), b = restored.reg.tensors();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(bitwise_equal(a[i], b[i]));
}

TEST_CASE("state registry: of two snapshot files the newer one is read; the writer keeps one") {
  gpurun::testing::TempDir dir("gpurun-state");
  const SnapshotPaths paths{(dir.path / "shm" / "x.snapshot").string(),
                            (dir.path / "state.snapshot").string()};
  Side first(Kind::kSgd, 1), second(Kind::kSgd, 2);
  first.step(0);
  second.step(0);
  second.step(1);
  // No primary directory: the first pause goes to the fallback (ENOENT at the primary).
  CHECK(write_to(first.reg, paths) == paths.fallback);
  std::filesystem::create_directories(dir.path / "shm");
  // A later pause by another writer (no kept mapping) goes to the primary and removes the
  // older file: a resume can never pick the stale one.
  CHECK(write_to(second.reg, paths) == paths.primary);
  CHECK_FALSE(std::filesystem::exists(paths.fallback));
  Side restored(Kind::kSgd, 3);
  CHECK(read_from(restored.reg, paths) == paths.primary);
  CHECK(restored.reg.checksum() == second.reg.checksum());

  // Both present (a crash between writing one and removing the other): the newer wins.
  (void)first.reg.close_snapshot();
  CHECK(write_to(first.reg, SnapshotPaths{paths.fallback, ""}) == paths.fallback);  // newer
  CHECK(std::filesystem::exists(paths.primary));
  Side again(Kind::kSgd, 4);
  CHECK(read_from(again.reg, paths) == paths.fallback);
  CHECK(again.reg.checksum() == first.reg.checksum());

  // Neither present: one error naming both paths.
  std::filesystem::remove(paths.primary);
  std::filesystem::remove(paths.fallback);
  const auto msg = error_of([&] { read_from(again.reg, paths); });
  CHECK(msg.find("'" + paths.primary + "'") != std::string::npos);
  CHECK(msg.find("'" + paths.fallback + "'") != std::string::npos);
}

TEST_CASE(
    "state registry on CUDA: a multi-chunk device state (64 MiB copy slices, the payload hashed "
    "behind the copies) round-trips bit-exact") {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: skipped (the CUDA build on a GPU machine runs it)");
    return;
  }
  gpurun::testing::TempDir dir("gpurun-state");
  const std::string path = (dir.path / "state.snap").string();
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  // 150 MiB (three slices), an odd size, an int32 buffer of 70 MiB: chunk and slice boundaries
  // fall inside tensors and between them.
  struct Big : torch::nn::Module {
    torch::Tensor a, b, c;
    Big(const torch::TensorOptions& o, bool fill) {
      a = register_parameter("a", fill ? torch::randn({int64_t{150} << 18}, o)
                                       : torch::zeros({int64_t{150} << 18}, o));
      b = register_parameter("b", fill ? torch::randn({(int64_t{7} << 18) + 13}, o)
                                       : torch::zeros({(int64_t{7} << 18) + 13}, o));
      c = register_buffer(
          "c", fill ? torch::randint(0, 1 << 30, {int64_t{70} << 18}, o.dtype(torch::kInt32))
                    : torch::zeros({int64_t{70} << 18}, o.dtype(torch::kInt32)));
    }
  };
  torch::manual_seed(3);
  Big src(cuda, true), dst(cuda, false);
  StateRegistry s, d;
  s.track_module(src);
  d.track_module(dst);
  s.write_snapshot(path);
  const auto& st = s.last_snapshot_stats();
  CHECK(st.tensor_bytes == static_cast<int64_t>(src.a.nbytes() + src.b.nbytes() + src.c.nbytes()));
  d.read_snapshot(path, torch::Device(torch::kCUDA, 0));  // verifies the payload checksum
  CHECK(torch::equal(src.a, dst.a));
  CHECK(torch::equal(src.b, dst.b));
  CHECK(torch::equal(src.c, dst.c));
  CHECK(d.checksum() == s.checksum());
}
