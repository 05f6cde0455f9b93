// gpurun::Runtime — makes a LibTorch training binary elastic under `gpurun --config`.
//
//   auto rt = gpurun::Runtime::from_env();
//   Net model; model->to(rt->device());
//   torch::optim::AdamW opt(model->parameters(), 1e-3);
//   rt->track(*model, opt);
//   auto& sampler = rt->sampler(train_size, {.seed = 42});
//   for (int64_t epoch : rt->epochs(max_epochs)) {
//     for (const gpurun::Step& step : rt->steps(micro_batch)) {
//       opt.zero_grad();
//       for (size_t i = 0; i < step.micro_batches.size(); ++i) {
//         auto loss = loss_of(step.micro_batches[i]) * step.weight(i);
//         loss.backward();
//       }
//       rt->all_reduce_gradients();
//       opt.step();
//     }
//   }
//
// Every end of an iteration of epochs() (and, with `[boundary] every = N`, every N steps of
// steps()) is a boundary: the rank reports to the supervisor and follows its decision
// (docs/control-protocol.md). A rank that leaves in hold mode blocks there, with its GPU memory
// freed, until it is woken as a joiner (then the loop continues with the current state) or
// told to exit. A rank that has left the job for good (release mode, or told to exit while
// parked) sees its loops end: steps() and epochs() finish, left() is true, and the program
// should skip what assumes it trained to the end (evaluation, checkpoints) and return from
// main promptly — the process ending is what gives its GPU back:
//
//   for (int64_t epoch : rt->epochs(max_epochs)) {
//     for (const gpurun::Step& step : rt->steps(micro_batch)) { ... }
//     if (rt->left()) break;   // a step boundary may end the epoch's steps early
//     evaluate(); ...
//   }
//   if (rt->left()) return 0;  // not trained to the end: write nothing
//   save(model);
//
// A joiner receives the current model, optimizer state, tracked scalars and sampler
// position from the decision's state source before its first epoch.
// Errors: every recoverable failure is a gpurun::Error (<gpurun/error.hpp>, included here);
// a collective that fails throws gpurun::CommError, replicas that differ gpurun::StateError,
// so a training binary can `catch (const gpurun::CommError&)`. Policy: docs/errors.md.
// Design and guarantees: docs/worker-runtime.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gpurun/elastic_sampler.hpp"
#include "gpurun/error.hpp"
#include "gpurun/state.hpp"
#include "gpurun/worker/worker_state.hpp"

namespace gpurun {

class Runtime;
namespace detail {
struct RuntimeSeams;
/// Internal (tests): a Runtime over given seams; see worker_runtime/src/runtime/runtime_seams.hpp.
std::unique_ptr<Runtime> make_runtime(RuntimeSeams seams);
}  // namespace detail

// Worker-side states, WorkerState (gpurun/worker/worker_state.hpp, the worker protocol
// engine's table): an elastic process starts REJOINING (a joiner until it holds the state) and
// is ACTIVE once epochs() started it; a static job is always ACTIVE.

struct RuntimeOptions {
  /// Gradient all-reduce bucket size in bytes (DDP's default: 25 MiB).
  int64_t bucket_bytes = 25 << 20;
  /// Deadline of one communicator rendezvous or collective.
  std::chrono::milliseconds comm_timeout{std::chrono::seconds(300)};
  /// After every start and resize: all-gather a checksum of the whole state and throw
  /// StateError naming the ranks when replicas differ.
  bool verify_state = true;
  /// Per-rank JSONL trace of boundaries (timings, checksums). Empty: $GPURUN_TRACE_DIR
  /// (file <dir>/gpu<slot>.jsonl), none when unset.
  std::string trace_dir;
};

/// One optimizer step of this rank: the sample indices it trains on, split in
/// micro-batches of at most the micro-batch size (possibly none: at the end of an epoch a
/// rank may get no sample; it must still call all_reduce_gradients()).
struct Step {
  int64_t epoch = 0;
  int64_t index = 0;        ///< optimizer step within the epoch, from 0
  int64_t global_step = 0;  ///< optimizer steps since the start of training
  /// Samples of this step over the whole world (the global batch; less at an epoch's end).
  int64_t global_samples = 0;
  int world_size = 1;
  std::vector<std::vector<int64_t>> micro_batches;
  /// Factor for the mean loss of micro-batch i, so that after all_reduce_gradients()
  /// (an average over the world) the gradient is d/dθ of the mean loss over the
  /// global_samples: |micro_batch i| · world_size / global_samples.
  double weight(size_t i) const;
  int64_t samples() const;  ///< this rank's samples in the step
};

class Runtime {
 public:
  /// Reads the worker environment gpurun sets (docs/cli.md, docs/control-protocol.md):
  /// elastic when GPURUN_ELASTIC=1 (joins the generation GPURUN_JOIN_GENERATION through the
  /// store), a static world from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT otherwise, and a
  /// world of one when none is set. Device: cuda:<i> when GPURUN_DEVICE=cuda, i the slot on
  /// this node (GPURUN_LOCAL_SLOT, else GPURUN_SLOT, else LOCAL_RANK), else CPU. Blocks while
  /// connecting (store timeout). Throws gpurun::Error naming the variable for bad environment,
  /// StoreError when the store cannot be reached.
  static std::unique_ptr<Runtime> from_env(RuntimeOptions options = {});
  ~Runtime();

  /// The device to put the model and batches on. A standby (GPURUN_STANDBY=1, gpurun's
  /// `[park] standby`) blocks in its first call until a config names its slot and only then
  /// sets up CUDA: a program that loads its data and builds its model skeleton before this
  /// call does that while its GPU stays free (docs/worker-runtime.md#standby). A standby told
  /// to exit instead ends the process here (status 0).
  at::Device device() const;
  int rank() const;        ///< rank in the current generation
  int world_size() const;  ///< active workers in the current generation
  int64_t generation() const;
  /// This worker's job slot id (GPURUN_SLOT / LOCAL_RANK): node k's local slot i is k*1000+i;
  /// its device is cuda:<GPURUN_LOCAL_SLOT> (device()).
  int gpu_id() const;
  bool elastic() const;
  WorkerState state() const;
  /// True when the state this process tracks is overwritten before its first step, so that
  /// its model needs no random initialisation (docs/worker-runtime.md#cheap-joiners): a
  /// joiner of a running job (spawned, warm, or resuming from the pause snapshot), or a rank
  /// other than 0 at a start (rank 0's initial state is broadcast, as DDP does). False for
  /// the rank whose state the others receive, and outside gpurun. Known from from_env() on,
  /// before track(); it does not change later (a hold-mode rank that rejoins keeps its
  /// tensors' storage, and their values are overwritten at the rejoin anyway).
  bool joining() const;
  /// True once this rank has left the job before the end of training: a leaver of a resize in
  /// release mode, or a hold-mode leaver told to exit while parked (state() == kExited). Its
  /// loops have ended (epochs() and steps() return no more), it holds no usable copy of the
  /// trained state (hold mode: its tensors were freed), rank()/world_size() are those of the
  /// generation it left, and collectives are local. Check it after the loop and skip what
  /// assumes training went to the end. False for a rank whose loop ended because the job is
  /// finishing (it holds the final state). Not thread-safe with the training loop.
  bool left() const;
  /// Preemption (docs/worker-runtime.md#preemption): true from the boundary at which gpurun's
  /// checkpoint request (its preemption-warning signal, `--preempt-signal`, default SIGUSR2)
  /// reached this job until the next boundary — the same boundary on every rank, so every
  /// rank can save (rank 0 writes) between those two boundaries. Elastic: the decision
  /// carries it; static: the ranks agree on it at every epoch boundary (one 8-byte all-gather
  /// while gpurun runs the job). Not thread-safe with the training loop.
  bool checkpoint_requested() const;
  /// True once the loops ended because gpurun asked the job to stop (it received SIGTERM, or
  /// the warning signal with --requeue): epochs() and steps() finished at a boundary, the
  /// same one on every rank, and the state is the one trained to there. Save a checkpoint
  /// and return 0 before gpurun's --stop-timeout runs out (then SIGTERM comes).
  bool stop_requested() const;
  /// Slots of the current generation, sorted (rank = index).
  std::vector<int> active_gpus() const;

  /// Registers the state that moves at a handoff. Call once, before epochs(), after the
  /// model is on device(). The optimizer may be Adam, AdamW, SGD, RMSprop or Adagrad
  /// (StateError otherwise). Param-group options (lr, …) move with it; LibTorch's
  /// LRScheduler keeps its step count private, so drive the learning rate from a tracked
  /// step counter (track_scalar) instead.
  void track(torch::nn::Module& module, torch::optim::Optimizer& optimizer);
  void track(torch::nn::Module& module);
  void track_scalar(const std::string& name, int64_t* value);
  void track_scalar(const std::string& name, double* value);
  void track_extension(const std::string& name, std::shared_ptr<StateExtension> extension);

  /// The sampler of the training set; its position (epoch, consumed samples) is part of the
  /// handed-off state. Call once, before epochs().
  ElasticSampler& sampler(int64_t dataset_size, ElasticSamplerOptions options = {});

  class EpochRange;
  class StepRange;
  /// Epochs from the current one (0, or the state source's for a joiner) to max_epochs-1;
  /// each increment is a boundary. Ends early when the job is finishing (another worker
  /// finished, or the supervisor said exit), and when this rank left (left() is then true).
  EpochRange epochs(int64_t max_epochs);
  /// The optimizer steps of the current epoch from the sampler's position. Global batch:
  /// `[batch] global` from config.toml when set, else micro_batch × world_size.
  /// drop_last (sampler option) drops a final step smaller than the global batch.
  /// A global batch above the epoch's samples: rank 0 warns once (each epoch is one step); with
  /// drop_last nothing could train, and every rank throws gpurun::Error naming both numbers.
  StepRange steps(int64_t micro_batch);

  /// This rank's micro-batches (sample indices) of the steps from the sampler's position up to
  /// the next boundary (the end of the epoch, or the next `[boundary] every` step), exactly as
  /// steps(micro_batch) will deal them if no resize happens — what a prefetching data loader
  /// needs. Does not change any state; no communication.
  std::vector<std::vector<int64_t>> upcoming_micro_batches(int64_t micro_batch) const;

  /// Averages every tracked parameter's gradient over the active world, bucketed
  /// (RuntimeOptions::bucket_bytes). Undefined gradients count as zeros (and become zeros).
  /// Blocks until done (CUDA: until enqueued on the current stream). Throws CommError when a
  /// peer fails.
  void all_reduce_gradients();
  /// Element-wise sum over the active world of a few numbers (metrics: loss sums, counts).
  std::vector<double> all_reduce_sum(std::vector<double> values);
  /// Checksum of the tracked state (see StateRegistry): equal on every rank after a boundary.
  /// Blocks until the device work is done. After left() (the tensors are freed): the checksum
  /// of the state it left with where its last boundary computed one (it wrote the pause
  /// snapshot, or handed the state on), else StateError.
  uint64_t state_checksum();

  /// The one-line form: for each epoch, train_one_epoch(epoch). Same semantics as epochs().
  void run(int64_t max_epochs, const std::function<void(int64_t epoch)>& train_one_epoch);

  struct Impl;

 private:
  friend std::unique_ptr<Runtime> detail::make_runtime(detail::RuntimeSeams seams);
  explicit Runtime(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class Runtime::EpochRange {
 public:
  class iterator {
   public:
    using value_type = int64_t;
    using difference_type = std::ptrdiff_t;
    int64_t operator*() const;
    iterator& operator++();
    bool operator==(std::default_sentinel_t) const;
    Runtime::Impl* rt = nullptr;
  };
  iterator begin();
  std::default_sentinel_t end() { return {}; }
  Runtime::Impl* rt = nullptr;
  int64_t max_epochs = 0;
};

class Runtime::StepRange {
 public:
  class iterator {
   public:
    using value_type = Step;
    using difference_type = std::ptrdiff_t;
    const Step& operator*() const;
    const Step* operator->() const { return &**this; }
    iterator& operator++();
    bool operator==(std::default_sentinel_t) const;
    Runtime::Impl* rt = nullptr;
  };
  iterator begin();
  std::default_sentinel_t end() { return {}; }
  Runtime::Impl* rt = nullptr;
  int64_t micro_batch = 0;
};

}  // namespace gpurun
