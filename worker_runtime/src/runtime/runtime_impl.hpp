// gpurun::Runtime::Impl: the runtime's state and the executor of the worker engine's actions,
// shared by its three rooms: runtime.cpp (the boundary loop, the engine's actions, steps, the
// start), runtime_snapshot.cpp (pause snapshots: written, read, prepared, premapped; leaving
// the GPU) and runtime_api.cpp (the public Runtime methods and the loop ranges).
// Protocol: docs/control-protocol.md; behaviour: docs/worker-runtime.md. Internal header.
#pragma once

#include "gpurun/runtime.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <thread>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/communicator.hpp"
#include "comm/gradient_sync.hpp"
#include "compat/torch_compat.hpp"
#include "gpurun/check.hpp"
#include "gpurun/control/progress.hpp"
#include "gpurun/env_names.hpp"
#include "gpurun/snapshot/format.hpp"
#include "gpurun/worker/worker_session.hpp"
#include "runtime/runtime_env.hpp"
#include "runtime/runtime_seams.hpp"
#include "runtime/trace.hpp"
#include "state/state_registry.hpp"

namespace gpurun {

using control::Decision;
using rt::Communicator;
using rt::Trace;
using Clock = std::chrono::steady_clock;

namespace rt {
inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
inline std::string hex(uint64_t v) {
  return fmt::format("{:016x}", v);
}
/// Preemption-warning signals caught (the handler only counts; boundaries read it).
extern std::atomic<uint64_t> g_preempt_signals;
}  // namespace rt
using rt::g_preempt_signals;
using rt::hex;
using rt::ms_since;
using snapshot::file_size_limit_below;  // the snapshot library's one check
using snapshot::file_size_limit_text;

struct Runtime::Impl {
  RuntimeOptions opt;
  /// The worker engine with its store I/O (gpurun/worker/worker_session.hpp); null unless
  /// elastic. This runtime executes its actions (drive()).
  std::unique_ptr<control::WorkerSession> control;
  rt::CommFactory comm_factory;  // rt::make_communicator unless a test's fake
  rt::StateObserver on_state;    // tests: every state change; may be empty
  store::ClientOptions store;
  at::Device device = at::kCPU;
  rt::CommBackend backend = rt::CommBackend::kGloo;
  int slot = 0;
  int rank = 0;
  int world = 1;
  int64_t generation = 0;
  int64_t restart_count = 0;
  std::vector<int> active{0};
  WorkerState state = WorkerState::kActive;
  std::string snapshot_path;
  std::string snapshot_fallback_path;
  rt::SnapshotPaths snapshot_paths() const { return {snapshot_path, snapshot_fallback_path}; }
  bool prepare_snapshot = false;  // GPURUN_SNAPSHOT_PREPARE (default on): map the file ahead
  bool reserve_ahead = true;      // GPURUN_RESERVE_AHEAD (default on): a resume's cache grown
  Trace trace;
  // Preemption (docs/cli.md#preemption): gpurun's request files, the signals seen so far.
  std::string preempt_dir;
  uint64_t preempt_seen = 0;
  bool checkpoint_req = false;  // checkpoint_requested(): this boundary interval
  bool stop_req = false;        // stop_requested()
  bool stop_file_exists() const {
    return !preempt_dir.empty() && ::access((preempt_dir + "/stop").c_str(), F_OK) == 0;
  }

  rt::StateRegistry registry;
  bool tracked = false;
  std::optional<ElasticSampler> sampler;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<rt::GradientSync> grads;

  // Position of training, tracked as scalars so it moves with the state.
  int64_t epoch = 0;          // epoch in progress (or next to start)
  int64_t step_in_epoch = 0;  // optimizer steps done in it
  int64_t global_step = 0;
  int64_t sampler_epoch = 0, sampler_cursor = 0;
  // Step progress for the supervisor's power-limit profiler (GPURUN_PROGRESS_FILE; null
  // when not given): two relaxed atomic stores per step.
  std::unique_ptr<control::ProgressWriter> progress;

  int64_t every_steps = 0;
  int64_t global_batch = 0;
  int64_t max_epochs = 0;
  bool started = false;
  bool device_pending = false;                     // CUDA not set up yet (ensure_device)
  std::function<void()> standby_exit;              // RuntimeSeams::standby_exit
  std::function<void(const at::Device&)> warm_up;  // RuntimeSeams::warm_up
  std::function<void()> warm_up_waited;            // RuntimeSeams::warm_up_waited
  // RuntimeSeams::export_env: the generation's RANK, WORLD_SIZE, … into the process environment
  std::function<void(const std::vector<control::EnvVar>&)> export_env;
  bool finishing = false;  // the job is finishing: loops end
  bool joining = false;    // Runtime::joining(): the tracked state is overwritten before training
  bool jumped = false;     // a hold-mode rejoin moved the position to another epoch
  Step step;               // current step of a StepRange
  int64_t step_count = 0;  // samples of the world in `step`
  int64_t range_epoch = -1;
  int64_t range_micro = 0;
  bool step_valid = false;
  /// A resize's generation began: its first step done is traced ("first_step", the benches'
  /// edit -> first step).
  bool first_step_pending = false;

  // ---- position <-> tracked scalars ----------------------------------------------------
  void sync_out() {
    if (sampler) {
      sampler_epoch = sampler->epoch();
      sampler_cursor = sampler->cursor();
    }
  }
  void sync_in() {
    if (sampler) sampler->load_state({sampler_epoch, sampler_cursor});
  }

  // ---- communicators ------------------------------------------------------------------
  /// A static job's communicator (no control protocol): its keys per restart attempt.
  std::unique_ptr<Communicator> make_static_comm(const std::vector<int>& group);

  /// The engine's kMakeGroup: its prefix, abort key, group and rank.
  std::unique_ptr<Communicator> make_comm(const control::EngineAction& a);

  // ---- state handoff ------------------------------------------------------------------
  /// Broadcasts the whole state from `root` of `c`: manifest (length, bytes), then every
  /// tensor in canonical order. Receivers first give their state the root's layout.
  int64_t broadcast_state(Communicator& c, int root);

  /// All-gathers the state checksum over `c`; throws StateError naming the ranks that
  /// differ from `root` (the state source) when replicas are not identical.
  uint64_t verify(Communicator& c, int root, const std::string& what);

  // ---- generations --------------------------------------------------------------------
  void adopt(const Decision& d) {
    generation = d.generation;
    active = d.active;
    rank = d.rank_of(slot);
    world = static_cast<int>(d.active.size());
    every_steps = d.every_steps;
    global_batch = d.global_batch;
  }

  // ---- the engine's actions (gpurun/worker/worker_engine.hpp), executed with LibTorch ----
  /// The checksum of the state this rank held when it left, where that boundary computed one
  /// (a pause's snapshot source, a leaving handoff source): state_checksum() after left().
  std::optional<uint64_t> left_checksum;
  std::optional<uint64_t> written_checksum;  ///< of the pause snapshot it wrote at this boundary
  std::optional<uint64_t> last_checksum;     ///< of the set-up in progress
  int64_t moved_bytes = 0;                   ///< state bytes moved by the set-up in progress
  std::unique_ptr<Communicator> handoff;     ///< a handoff group (source ∪ joiners), if any
  Clock::time_point setup_t0;

  Communicator& group_comm() {
    Communicator* c = handoff ? handoff.get() : comm.get();
    GPURUN_CHECK(c, "slot {}: a state action without a communicator", slot);
    return *c;
  }

  /// Feeds `e` to the worker engine and runs its actions, feeding each outcome back, until the
  /// engine waits for the program. Returns the last action (kTrain or kExit after a decision;
  /// a kExit sets `finishing`).
  control::EngineAction drive(control::EngineEvent e);

  control::EngineEvent outcome(control::EngineEvent::Kind kind, std::string text = {},
                               int64_t bytes = 0) {
    control::EngineEvent e;
    e.kind = kind;
    e.text = std::move(text);
    e.bytes = bytes;
    e.epoch = epoch;
    e.step = step_in_epoch;
    return e;
  }

  /// One action; its outcome event when it needs one. A peer's failure (CommError) inside a
  /// collective action is its kFailed outcome; every other error propagates (the process dies
  /// and gpurun handles it).
  std::optional<control::EngineEvent> execute(const control::EngineAction& a);

  /// kTrain: training goes on in the generation the engine says.
  void train_on(const control::EngineAction& a);

  void trace_resize(const Decision& d, const std::string& role, int64_t bytes,
                    std::optional<uint64_t> checksum) {
    trace.write("generation",
                {{"generation", Trace::num(d.generation)},
                 {"kind", Trace::str(std::string(control::to_string(d.kind)))},
                 {"role", Trace::str(role)},
                 {"gpu", Trace::num(int64_t{slot})},
                 {"rank", Trace::num(int64_t{d.rank_of(slot)})},
                 {"world", Trace::num(static_cast<int64_t>(d.active.size()))},
                 {"active", Trace::ints(d.active)},
                 {"state_source_gpu", Trace::num(int64_t{d.state_source.gpu})},
                 {"epoch", Trace::num(epoch)},
                 {"step", Trace::num(step_in_epoch)},
                 {"bytes", Trace::num(bytes)},
                 {"checksum", checksum ? Trace::str(hex(*checksum)) : "null"},
                 {"ms", Trace::num(setup_t0 == Clock::time_point{} ? 0.0 : ms_since(setup_t0))}});
  }

  /// kReadSnapshot: a resume's member loads the pause snapshot (every member of a paused job
  /// holds no state: it is the snapshot's). The payload is verified while it is copied (a
  /// corrupt file leaves the tensors released); a state at another position than the pause's
  /// (an older snapshot copied over it) is refused before training rolls back.
  void read_pause_snapshot(int64_t want_epoch, int64_t want_step);

  /// A leaver's common part: the communicator and the gradient buckets go.
  void offload_common(const std::string& role);

  /// kRelease: no std::exit — epochs() ends, user code after the loop (which checks left())
  /// and the destructors run, and the process ends; the supervisor counts its exit 0 as
  /// PARKED. The state (written to the snapshot, or handed on) is freed now, so that the GPU
  /// holds only the context. The page-locked snapshot mapping is left to the process's end:
  /// its unpinning and unmapping here, with the process's threads still running, took ~0.75 s
  /// for ViT-H's 7.5 GB on the H200 (docs/results.md); the exit does both for less.
  void release_state(const std::string& role);

  /// kPark: hold mode frees its GPU memory (the CUDA context stays) and waits for its wake.
  void park_state(const std::string& role);

  /// The epoch position before the rejoin of a hold-mode rank: a jump when the state's differs.
  void after_join(int64_t epoch_before) {
    if (epoch != epoch_before) jumped = true;  // rejoined (hold mode) at another epoch
  }

  // ---- boundaries ---------------------------------------------------------------------
  /// Sets up the CUDA device (a no-op on CPU, or once done). A standby first waits for its go
  /// key (the engine's kDevice): until then this process has created no CUDA context.
  void ensure_device();

  void ensure_started();

  /// A boundary: report, wait for the decision, follow it (the engine's actions). Returns
  /// false when the job is finishing (loops end).
  bool boundary(int64_t report_epoch, int64_t report_step);

  /// A static job's boundary (no control protocol), only while gpurun runs it
  /// (GPURUN_PREEMPT_DIR): this rank's requests — a warning signal caught since the last
  /// boundary (checkpoint), the stop file (stop) — OR-ed over the world with one all-gather, so
  /// that every rank acts at the same boundary. Returns false when the job stops here.
  bool static_boundary();

  /// The state source's part of a `snapshot` decision: writes the pause snapshot (primary
  /// path, else the fallback) and reads it back. Returns "ok", or the error sentence (every
  /// attempt; no snapshot file is left then and the state in memory is untouched): gpurun then
  /// refuses the pause and the job trains on.
  std::string write_pause_snapshot();

  // ---- prepared snapshots (docs/worker-runtime.md#snapshot-files) ---------------------
  std::thread prepare_thread;
  std::atomic<bool> prepare_done{false};  // set by prepare_thread when `prepared` is written
  std::optional<rt::StateRegistry::PreparedSnapshot> prepared;
  Clock::time_point prepare_t0;
  std::string prepare_note;  // the lock fallback, said when the file is adopted

  /// One line on stderr (rank 0 only: every rank of the node sees the same /dev/shm and
  /// limits) and the trace.
  void snapshot_note(const std::string& line);

  /// After the first optimizer step of an elastic rank's steps() loop, or at its first
  /// `continue` boundary when it uses only epochs() (the optimizer has made its state, so the
  /// size is known), unless GPURUN_SNAPSHOT_PREPARE=0: creates, reserves, maps and locks
  /// (CUDA: cudaHostRegister; CPU: mlock) the pause snapshot file on a background thread, so
  /// that a pause only copies and no boundary waits for it. Skipped, with one line saying so,
  /// when the snapshot path's file system (/dev/shm) has less free space than the file; a CPU
  /// state whose file exceeds RLIMIT_MEMLOCK is prepared without mlock (said too).
  void start_snapshot_preparation();

  /// Joins the background preparation (waits for it if it still runs) and gives the file to
  /// the registry. Before anything that writes, reads or changes the state's storage.
  void finish_snapshot_preparation();

  // ---- a warm joiner maps the pause snapshot while it starts -----------------------------
  std::thread premap_thread;
  std::optional<rt::StateRegistry::PreparedSnapshot> premapped;  // written by premap_thread

  /// A warm joiner (from make_runtime) of a paused job (the node's snapshot file holds a
  /// committed snapshot): maps the file and page-locks it (CUDA) on a thread while the program
  /// builds its model and loads its data, so that the resume only verifies and copies
  /// (ViT-H's 7.5 GB: ~0.9 s of map and cudaHostRegister otherwise inside the resume). The
  /// file is not changed here; adopt_premapped() gives the mapping to the registry, which then
  /// reads the snapshot in it (and writes the next pause into it). A standby calls it twice:
  /// map_only while it waits for its go (no CUDA: the mapping and its page tables, ~0.3 s for
  /// ViT-H), then after the go, when only the page-locking is left if the file is still the
  /// one mapped (snapshot::finish_prepared_snapshot).
  void start_premap(bool map_only = false);
  bool premap_map_only = false;  // premap_thread maps only (a standby's, before its go)

  /// Joins start_premap()'s thread and gives its mapping to the registry (none: nothing).
  void adopt_premapped();

  /// A standby, before it waits for its go: what needs no CUDA context is done now, not on
  /// the resume's critical path: on a CUDA device cuDNN's and cuBLAS's lazily opened libraries
  /// are loaded (control::preload_libraries_beside); on any, the pause snapshot is mapped
  /// (start_premap map_only). bench/resize_latency.sh's standby rows measure it.
  void standby_ahead();

  // ---- the CUDA libraries set up beside the program's start -------------------------------
  std::thread warm_thread;
  std::string warm_error;  // written by warm_thread: what failed (it is only a warm-up)

  /// An elastic CUDA process, once its device is set up: the checksum's kernels and the math
  /// libraries (rt::warm_cuda_libraries) are set up on a thread while the program builds its
  /// model and the state arrives, not in the first step (ViT-H on an H200: a fresh process's
  /// first step 2.8 s against 0.16 s, bench/vit_step_bench --step-times).
  void start_warm_up();
  /// Joins start_warm_up()'s thread; a failure is printed, never thrown. Called at the end of
  /// a generation's first step (next_step; train_on does not wait: the first step runs beside
  /// the rest of it, and makes its own cuBLAS/cuDNN handles if the warm-up still holds its),
  /// and before anything that frees device memory, writes the snapshot or drops a
  /// communicator.
  void finish_warm_up();

  ~Impl() {
    const auto t0 = Clock::now();
    if (warm_thread.joinable()) warm_thread.join();
    if (premap_thread.joinable()) premap_thread.join();
    if (prepare_thread.joinable()) prepare_thread.join();
    // The program is done with the runtime: what follows until the process is reaped (its
    // other destructors, the CUDA context's teardown) is outside it (bench/resize_latency.sh).
    trace.write("runtime_end", {{"join_ms", Trace::num(ms_since(t0))}});
  }

  /// After a failed collective: the engine drops the communicator and reports at once (same
  /// position); the supervisor answers without the rank that failed. Returns like boundary().
  bool recover(const std::string& why);

  // ---- steps --------------------------------------------------------------------------
  /// One optimizer step's share of the epoch, dealt from sampler position `s`.
  struct Window {
    int64_t count = 0;  // samples of the whole world: the global batch, less at the end
    std::vector<std::vector<int64_t>> micro_batches;  // this rank's, at most `micro` each
  };
  /// Samples of the world in the step at the sampler's cursor for a world of `w` ranks; 0 at
  /// the end of the epoch (with drop_last: also before a last window smaller than the global
  /// batch). Global batch: `[batch] global`, else micro × w.
  int64_t window_count(const ElasticSampler& s, int64_t micro, int w) const {
    const int64_t g = global_batch > 0 ? global_batch : micro * w;
    const int64_t remaining = s.remaining();
    if (remaining == 0 || (remaining < g && s.options().drop_last)) return 0;
    return std::min(g, remaining);
  }
  /// The next step's window, nullopt at the end of the epoch (with drop_last: also before a
  /// last window smaller than the global batch). Global batch: `[batch] global`, else
  /// micro × world.
  std::optional<Window> next_window(const ElasticSampler& s, int64_t micro) const {
    Window w;
    w.count = window_count(s, micro, world);
    if (w.count == 0) return std::nullopt;
    const std::vector<int64_t> mine = s.window_indices(w.count, rank, world);
    const auto at = [&](size_t i) {
      return mine.begin() + static_cast<std::ptrdiff_t>(std::min(i, mine.size()));
    };
    for (size_t i = 0; i < mine.size(); i += static_cast<size_t>(micro))
      w.micro_batches.emplace_back(at(i), at(i + static_cast<size_t>(micro)));
    return w;
  }

  /// Runs collective `op` on the current communicator. When a peer failed during it: reports
  /// at once (recover()), follows the decision without the failed rank, and runs `op` once
  /// more on the new communicator. Returns false when `op` could not be run to the end (the
  /// job is finishing, or no peer is left to run it with).
  template <class Op>
  bool run_collective(Op&& op) {
    try {
      op();
      return true;
    } catch (const rt::CommError& err) {
      if (!control) throw;
      const int64_t step_before = global_step;
      const int world_before = world;
      if (!recover(err.what()) || !comm || world == 1 || jumped) return false;
      // A survivor a step ahead handed this rank its state (docs/worker-runtime.md#failures):
      // the step in flight is now the ahead rank's (built over the old world), and its end
      // moves the sampler past that step's samples, as on the ahead rank.
      if (global_step != step_before && step_valid && sampler)
        step_count = window_count(*sampler, range_micro, world_before);
    }
    op();
    return true;
  }

  /// The `[batch] global` value last warned about (0: none), so the warning is printed once.
  int64_t warned_global_batch = 0;
  /// `[batch] global` against the epoch's sample count (the sampler's dataset size), at every
  /// step built: larger with drop_last throws (every step would be dropped: nothing trains);
  /// without drop_last, each epoch is one optimizer step of the whole epoch: rank 0 warns once
  /// per value (a new value from a config edit warns again). Same on every rank (the decision
  /// and the dataset size are), so every rank throws at the same step, before any collective.
  void check_global_batch(const ElasticSampler& s);

  void build_step();

  void next_step();
};

}  // namespace gpurun
