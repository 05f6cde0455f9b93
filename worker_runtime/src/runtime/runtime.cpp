// gpurun::Runtime: the boundary loop, the worker-side state machine and the state handoff.
// Protocol: docs/control-protocol.md; behaviour: docs/worker-runtime.md.
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
#include "gpurun/control/worker_session.hpp"
#include "gpurun/env_names.hpp"
#include "gpurun/snapshot/format.hpp"
#include "runtime/runtime_env.hpp"
#include "runtime/runtime_seams.hpp"
#include "runtime/trace.hpp"
#include "state/state_registry.hpp"

namespace gpurun {

using control::Decision;
using rt::Communicator;
using rt::Trace;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string hex(uint64_t v) {
  return fmt::format("{:016x}", v);
}

/// Preemption-warning signals caught (the handler only counts; boundaries read it).
std::atomic<uint64_t> g_preempt_signals{0};
/// Under Slurm, slurmstepd sends SIGTERM (time limit, scancel, preemption) to every process of
/// the step, so the workers get it straight from Slurm besides gpurun. One not from gpurun
/// (the parent) asks for a stop at the next boundary, like gpurun's stop request; gpurun's
/// own SIGTERM (after --stop-timeout) still ends the process at once.
std::atomic<int> g_external_term{0};
extern "C" void on_term_signal(int sig, siginfo_t* info, void*) {
  if (info && info->si_pid != 0 && info->si_pid == ::getppid()) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(sig, &dfl, nullptr);
    ::raise(sig);
    return;
  }
  g_external_term.store(1, std::memory_order_relaxed);
}
extern "C" void on_preempt_signal(int) {
  g_preempt_signals.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

using snapshot::file_size_limit_below;  // the snapshot library's one check
using snapshot::file_size_limit_text;

double Step::weight(size_t i) const {
  GPURUN_CHECK(i < micro_batches.size(), "micro-batch {} of {}", i, micro_batches.size());
  if (global_samples == 0) return 0.0;
  return static_cast<double>(micro_batches[i].size()) * world_size /
         static_cast<double>(global_samples);
}

int64_t Step::samples() const {
  int64_t n = 0;
  for (const auto& mb : micro_batches) n += static_cast<int64_t>(mb.size());
  return n;
}

struct Runtime::Impl {
  RuntimeOptions opt;
  /// The worker engine with its store I/O (gpurun/control/worker_session.hpp); null unless
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
  bool device_pending = false;         // CUDA not set up yet (ensure_device)
  std::function<void()> standby_exit;  // RuntimeSeams::standby_exit
  bool finishing = false;              // the job is finishing: loops end
  bool joining = false;    // Runtime::joining(): the tracked state is overwritten before training
  bool jumped = false;     // a hold-mode rejoin moved the position to another epoch
  Step step;               // current step of a StepRange
  int64_t step_count = 0;  // samples of the world in `step`
  int64_t range_epoch = -1;
  int64_t range_micro = 0;
  bool step_valid = false;

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
  std::unique_ptr<Communicator> make_static_comm(const std::vector<int>& group) {
    rt::CommOptions o;
    o.store = store;
    o.prefix = fmt::format("gpurun/static/{}/comm/train", restart_count);
    o.rank = rank;
    o.size = static_cast<int>(group.size());
    o.device = device;
    o.timeout = opt.comm_timeout;
    return comm_factory(backend, o);
  }

  /// The engine's kMakeGroup: its prefix, abort key, group and rank.
  std::unique_ptr<Communicator> make_comm(const control::EngineAction& a) {
    rt::CommOptions o;
    o.store = store;
    o.prefix = a.prefix;
    o.rank = a.rank;
    o.size = static_cast<int>(a.group.size());
    o.device = device;
    o.timeout = opt.comm_timeout;
    // gpurun abandons a generation whose set-up lost a participant: stop waiting at once.
    o.abort.key = a.abort_key;
    GPURUN_CHECK(o.rank >= 0, "slot {} is not in group [{}]", slot, fmt::join(a.group, ","));
    return comm_factory(backend, o);
  }

  // ---- state handoff ------------------------------------------------------------------
  /// Broadcasts the whole state from `root` of `c`: manifest (length, bytes), then every
  /// tensor in canonical order. Receivers first give their state the root's layout.
  int64_t broadcast_state(Communicator& c, int root) {
    sync_out();
    std::string manifest;
    if (c.rank() == root) manifest = registry.manifest();
    const auto bytes_opts = at::TensorOptions().dtype(at::kByte);
    at::Tensor len = at::full({1}, static_cast<int64_t>(manifest.size()),
                              at::TensorOptions().dtype(at::kLong).device(device));
    c.broadcast(len, root);
    const int64_t n = len.to(at::kCPU).item<int64_t>();
    at::Tensor buf = at::empty({n}, bytes_opts);
    if (c.rank() == root) std::memcpy(buf.data_ptr(), manifest.data(), manifest.size());
    at::Tensor dbuf = buf.to(device);
    c.broadcast(dbuf, root);
    if (c.rank() != root) {
      buf = dbuf.to(at::kCPU);
      manifest.assign(static_cast<const char*>(buf.data_ptr()), static_cast<size_t>(n));
      registry.apply_manifest(manifest, device);
      sync_in();
    }
    for (at::Tensor& t : registry.tensors()) c.broadcast(t, root);
    c.synchronize();
    return registry.nbytes();
  }

  /// All-gathers the state checksum over `c`; throws StateError naming the ranks that
  /// differ from `root` (the state source) when replicas are not identical.
  uint64_t verify(Communicator& c, int root, const std::string& what) {
    sync_out();
    const uint64_t mine = registry.checksum();
    if (!opt.verify_state) return mine;
    const std::vector<int64_t> all = c.all_gather_int64(static_cast<int64_t>(mine));
    const uint64_t want = static_cast<uint64_t>(all.at(static_cast<size_t>(root)));
    std::vector<std::string> bad;
    for (size_t r = 0; r < all.size(); ++r)
      if (static_cast<uint64_t>(all[r]) != want)
        bad.push_back(fmt::format("rank {} has {}", r, hex(static_cast<uint64_t>(all[r]))));
    if (!bad.empty())
      throw rt::StateError(
          fmt::format("state checksum mismatch {} (generation {}): rank {} (the source) has {}, {}",
                      what, generation, root, hex(want), fmt::join(bad, ", ")));
    return mine;
  }

  // ---- generations --------------------------------------------------------------------
  void adopt(const Decision& d) {
    generation = d.generation;
    active = d.active;
    rank = d.rank_of(slot);
    world = static_cast<int>(d.active.size());
    every_steps = d.every_steps;
    global_batch = d.global_batch;
  }

  // ---- the engine's actions (gpurun/control/worker_engine.hpp), executed with LibTorch ----
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
  control::EngineAction drive(control::EngineEvent e) {
    control::EngineAction last;
    while (true) {
      std::optional<control::EngineEvent> next;
      for (control::EngineAction& a : control->on(std::move(e))) {
        next = execute(a);
        last = std::move(a);
      }
      if (!next) break;
      e = std::move(*next);
    }
    return last;
  }

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
  std::optional<control::EngineEvent> execute(const control::EngineAction& a) {
    using K = control::EngineAction::Kind;
    using Ev = control::EngineEvent::Kind;
    if (a.kind != K::kLog && a.kind != K::kState &&
        !(a.kind == K::kTrain && a.decision.kind == Decision::Kind::kContinue)) {
      adopt_premapped();              // a warm joiner's mapping of the snapshot file
      finish_snapshot_preparation();  // the state changes below: the preparation must be over
    }
    switch (a.kind) {
      case K::kLog:
        trace.write("log", {{"text", Trace::str(a.text)}});
        return std::nullopt;
      case K::kState: {
        const WorkerState from = state;
        state = a.to;
        trace.write("state", {{"from", Trace::str(to_string(from))},
                              {"to", Trace::str(to_string(a.to))},
                              {"gpu", Trace::num(int64_t{slot})},
                              {"reason", Trace::str(a.text)}});
        if (on_state) on_state(from, a.to, a.text);
        return std::nullopt;
      }
      case K::kDropGroup:
        if (a.abort) {
          if (handoff) handoff->abort();
          if (comm) comm->abort();
        }
        if (handoff && !a.abort) {
          handoff.reset();
          return std::nullopt;
        }
        handoff.reset();
        if (grads) grads->set_communicator(nullptr);
        comm.reset();  // the old generation's communicator ends here
        return std::nullopt;
      case K::kMakeGroup:
        try {
          if (setup_t0 == Clock::time_point{}) setup_t0 = Clock::now();
          auto c = make_comm(a);
          (a.purpose == "train" ? comm : handoff) = std::move(c);
          return outcome(Ev::kDone);
        } catch (const rt::CommError& err) {
          return outcome(Ev::kFailed, err.what());
        }
      case K::kBroadcastState:
        try {
          moved_bytes = broadcast_state(group_comm(), a.root);
          return outcome(Ev::kDone, {}, moved_bytes);
        } catch (const rt::CommError& err) {
          return outcome(Ev::kFailed, err.what());
        }
      case K::kVerifyState:
        try {
          last_checksum = verify(group_comm(), a.root, a.text);
          return outcome(Ev::kDone);
        } catch (const rt::CommError& err) {
          return outcome(Ev::kFailed, err.what());
        }
      case K::kWriteSnapshot:
        return outcome(Ev::kDone, write_pause_snapshot());
      case K::kReadSnapshot:
        read_pause_snapshot(a.epoch, a.step);
        moved_bytes = registry.nbytes();
        return outcome(Ev::kDone, {}, moved_bytes);
      case K::kRelease:
        release_state(a.role);
        return outcome(Ev::kDone);
      case K::kPark:
        park_state(a.role);
        return outcome(Ev::kDone);
      case K::kTrain:
        train_on(a);
        return std::nullopt;
      case K::kExit:
        finishing = true;
        checkpoint_req = false;
        if (!a.left) {
          stop_req = a.stop;  // the session saw gpurun's stop file
          if (stop_req)
            trace.write("stop",
                        {{"epoch", Trace::num(epoch)}, {"step", Trace::num(step_in_epoch)}});
        }
        return std::nullopt;
      case K::kSet:
      case K::kWaitGet:  // WorkerSession runs these
        break;
    }
    throw InvariantError(
        fmt::format("slot {}: unexpected engine action {}", slot, control::to_string(a.kind)));
  }

  /// kTrain: training goes on in the generation the engine says.
  void train_on(const control::EngineAction& a) {
    const Decision& d = a.decision;
    checkpoint_req = d.checkpoint;
    if (d.kind == Decision::Kind::kContinue) {
      every_steps = d.every_steps;
      global_batch = d.global_batch;
      if (prepare_snapshot) start_snapshot_preparation();
      if (prepare_done.load(std::memory_order_acquire)) finish_snapshot_preparation();
      return;
    }
    adopt(d);
    if (grads) grads->set_communicator(comm.get());
    trace_resize(d, a.role, moved_bytes, last_checksum);
    moved_bytes = 0;
    last_checksum.reset();
    setup_t0 = {};
  }

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
  void read_pause_snapshot(int64_t want_epoch, int64_t want_step) {
    registry.read_snapshot(snapshot_paths(), device, rt::StateRegistry::Verify::kWhileCopying);
    if (want_epoch >= 0 && (epoch != want_epoch || step_in_epoch != want_step)) {
      const std::string path = registry.last_snapshot_stats().path;
      registry.release();
      throw rt::StateError(fmt::format(
          "the pause snapshot {} holds the state at epoch {} step {}, but the pause it resumes "
          "was at epoch {} step {}: refusing to roll training back (was an older snapshot "
          "copied over it?)",
          path, epoch, step_in_epoch, want_epoch, want_step));
    }
    sync_in();
    const auto& st = registry.last_snapshot_stats();
    trace.write("snapshot_read", {{"path", Trace::str(st.path)},
                                  {"bytes", Trace::num(st.file_bytes)},
                                  {"pinned", Trace::num(int64_t{st.pinned})},
                                  {"setup_ms", Trace::num(st.setup_seconds * 1e3)},
                                  {"pin_ms", Trace::num(st.pin_seconds * 1e3)},
                                  {"copy_ms", Trace::num(st.copy_seconds * 1e3)},
                                  {"checksum_ms", Trace::num(st.checksum_seconds * 1e3)},
                                  {"ms", Trace::num(st.total_seconds * 1e3)}});
  }

  /// A leaver's common part: the communicator and the gradient buckets go.
  void offload_common(const std::string& role) {
    left_checksum = last_checksum ? last_checksum : written_checksum;
    trace_resize(control->engine().current(), role, moved_bytes, last_checksum);
    comm.reset();
    handoff.reset();
    if (grads) {
      grads->set_communicator(nullptr);
      grads->release();
    }
  }

  /// kRelease: no std::exit — epochs() ends, user code after the loop (which checks left())
  /// and the destructors run, and the process ends; the supervisor counts its exit 0 as
  /// PARKED. The state (written to the snapshot, or handed on) is freed now, so that the GPU
  /// holds only the context. The page-locked snapshot mapping is left to the process's end:
  /// its unpinning and unmapping here, with the process's threads still running, took ~0.75 s
  /// for ViT-H's 7.5 GB on the H200 (docs/results.md); the exit does both for less.
  void release_state(const std::string& role) {
    const auto t0 = Clock::now();
    offload_common(role);
    const auto t_free = Clock::now();
    registry.release();  // device memory: every cached block too
    const double free_ms = ms_since(t_free);
    registry.leave_snapshot_to_exit();  // the file stays; its mapping ends with the process
    trace.write("exit", {{"reason", Trace::str("release mode: a leaver's loop ends")},
                         {"free_ms", Trace::num(free_ms)},
                         {"ms", Trace::num(ms_since(t0))}});
  }

  /// kPark: hold mode frees its GPU memory (the CUDA context stays) and waits for its wake.
  void park_state(const std::string& role) {
    const auto t0 = Clock::now();
    offload_common(role);
    registry.release();
    if (device.is_cuda()) rt::compat::release_cached_device_memory();
    trace.write("parked", {{"ms", Trace::num(ms_since(t0))},
                           {"device_bytes", Trace::num(registry.nbytes())}});
  }

  /// The epoch position before the rejoin of a hold-mode rank: a jump when the state's differs.
  void after_join(int64_t epoch_before) {
    if (epoch != epoch_before) jumped = true;  // rejoined (hold mode) at another epoch
  }

  // ---- boundaries ---------------------------------------------------------------------
  /// Sets up the CUDA device (a no-op on CPU, or once done). A standby first waits for its go
  /// key (the engine's kDevice): until then this process has created no CUDA context.
  void ensure_device() {
    if (!device_pending) return;
    device_pending = false;
    if (control && control->engine().standby()) {
      const auto t0 = Clock::now();
      trace.write("standby", {{"gpu", Trace::num(int64_t{slot})}});
      control::EngineEvent ev;
      ev.kind = control::EngineEvent::Kind::kDevice;
      drive(std::move(ev));
      if (finishing) {  // told to exit: it holds nothing, and its program must not go on
        trace.write("standby_exit", {{"gpu", Trace::num(int64_t{slot})}});
        if (standby_exit) standby_exit();
        std::exit(0);
      }
      trace.write("standby_go", {{"waited_ms", Trace::num(ms_since(t0))}});
      start_premap();
    }
    if (!device.is_cuda()) return;
    if (!torch::cuda::is_available())
      throw Error(
          fmt::format("{}=cuda but LibTorch sees no CUDA device (a CPU-only LibTorch, or "
                      "CUDA_VISIBLE_DEVICES is empty)",
                      env::kDevice));
    c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(device);
  }

  void ensure_started() {
    if (started) return;
    ensure_device();
    GPURUN_CHECK(tracked, "Runtime::track() must be called before epochs()/steps()");
    started = true;
    if (control) {
      // An elastic process starts REJOINING (make_runtime): a joiner until it holds the
      // state. A warm joiner is ready here (model built and tracked, data loaded): the engine
      // says so and waits, without a deadline, for gpurun to admit it (or to say exit).
      if (control->engine().warm()) trace.write("warm_ready", {{"gpu", Trace::num(int64_t{slot})}});
      control::EngineEvent ready;
      ready.kind = control::EngineEvent::Kind::kReady;
      drive(std::move(ready));
      return;
    }
    if (world > 1) {  // a static data-parallel job: rank 0's initial state, as DDP does
      const auto t0 = Clock::now();
      comm = make_static_comm(active);
      const int64_t moved = broadcast_state(*comm, 0);
      const uint64_t sum = verify(*comm, 0, "at the start");
      if (grads) grads->set_communicator(comm.get());
      trace.write("generation", {{"generation", Trace::num(int64_t{0})},
                                 {"kind", Trace::str("static")},
                                 {"role", Trace::str(rank == 0 ? "source" : "member")},
                                 {"rank", Trace::num(int64_t{rank})},
                                 {"world", Trace::num(int64_t{world})},
                                 {"bytes", Trace::num(moved)},
                                 {"checksum", Trace::str(hex(sum))},
                                 {"ms", Trace::num(ms_since(t0))}});
    }
  }

  /// A boundary: report, wait for the decision, follow it (the engine's actions). Returns
  /// false when the job is finishing (loops end).
  bool boundary(int64_t report_epoch, int64_t report_step) {
    if (finishing) return false;
    if (!control) return static_boundary();
    const auto t0 = Clock::now();
    const int64_t epoch_before = epoch;
    written_checksum.reset();
    control::EngineEvent b;
    b.kind = control::EngineEvent::Kind::kBoundary;
    b.epoch = report_epoch;
    b.step = report_step;
    const control::EngineAction last = drive(std::move(b));
    const Decision& d = control->engine().current();
    trace.write("boundary", {{"generation", Trace::num(d.prev_generation)},
                             {"round", Trace::num(d.round)},
                             {"epoch", Trace::num(report_epoch)},
                             {"step", Trace::num(report_step)},
                             {"kind", Trace::str(std::string(control::to_string(d.kind)))},
                             {"rank", Trace::num(int64_t{rank})},
                             {"world", Trace::num(int64_t{world})},
                             {"wait_ms", Trace::num(ms_since(t0))}});
    if (finishing) return false;
    if (last.kind == control::EngineAction::Kind::kTrain &&
        last.decision.kind == Decision::Kind::kResize)
      after_join(epoch_before);
    return true;
  }

  /// A static job's boundary (no control protocol), only while gpurun runs it
  /// (GPURUN_PREEMPT_DIR): this rank's requests — a warning signal caught since the last
  /// boundary (checkpoint), the stop file (stop) — OR-ed over the world with one all-gather, so
  /// that every rank acts at the same boundary. Returns false when the job stops here.
  bool static_boundary() {
    if (preempt_dir.empty()) return true;
    int64_t mine = 0;
    const uint64_t n = g_preempt_signals.load(std::memory_order_relaxed);
    if (n != preempt_seen) {
      preempt_seen = n;
      mine |= 1;
    }
    if (stop_file_exists() || g_external_term.load(std::memory_order_relaxed) != 0) mine |= 2;
    int64_t all = mine;
    if (comm && world > 1)
      for (int64_t bits : comm->all_gather_int64(mine)) all |= bits;
    checkpoint_req = (all & 1) != 0;
    if ((all & 3) != 0)
      trace.write("preempt", {{"epoch", Trace::num(epoch)},
                              {"checkpoint", Trace::num(all & 1)},
                              {"stop", Trace::num((all >> 1) & 1)}});
    if ((all & 2) == 0) return true;
    stop_req = true;
    finishing = true;
    return false;
  }

  /// The state source's part of a `snapshot` decision: writes the pause snapshot (primary
  /// path, else the fallback) and reads it back. Returns "ok", or the error sentence (every
  /// attempt; no snapshot file is left then and the state in memory is untouched): gpurun then
  /// refuses the pause and the job trains on.
  std::string write_pause_snapshot() {
    const auto t0 = Clock::now();
    try {
      sync_out();
      // A file-size limit below the file would end this process (SIGXFSZ) in the middle of
      // the write: refuse the pause instead (training goes on), saying why.
      if (const auto plan = registry.plan_snapshot_preparation(snapshot_paths()); !plan.done)
        if (auto limit = file_size_limit_below(plan.file_bytes))
          throw rt::StateError("cannot write the pause snapshot: " +
                               file_size_limit_text(*limit, plan.file_bytes));
      // The state checksum (device kernels, ~50 ms for ViT-H) runs on a thread while this one
      // writes (copies on a side stream, hashing on the host): neither changes the state, and
      // the pause waits for both. Its kernels go on a stream of their own that waits for the
      // last step's work (so the copies, which wait for this thread's current stream, do not
      // queue behind them).
      const c10::Stream stream = rt::compat::forked_stream(device);
      std::optional<uint64_t> sum;
      std::exception_ptr sum_error;
      std::optional<std::thread> summer;
      try {
        summer.emplace([&] {
          try {
            const at::NoGradGuard no_grad;
            const c10::StreamGuard on(stream);
            sum = registry.checksum();
          } catch (...) {
            sum_error = std::current_exception();
          }
        });
      } catch (const std::system_error&) {  // no thread: after the write, on this one
      }
      std::string path;
      try {
        path = registry.write_snapshot(snapshot_paths());
      } catch (...) {
        if (summer) summer->join();
        throw;
      }
      if (summer) {
        summer->join();
        if (sum_error) std::rethrow_exception(sum_error);
      } else {
        sum = registry.checksum();
      }
      const auto& st = registry.last_snapshot_stats();
      written_checksum = sum;
      trace.write("snapshot_written",
                  {{"path", Trace::str(path)},
                   {"bytes", Trace::num(st.file_bytes)},
                   {"tensor_bytes", Trace::num(st.tensor_bytes)},
                   {"checksum", Trace::str(hex(*written_checksum))},
                   {"fell_back", Trace::num(static_cast<int64_t>(st.failed_attempts.size()))},
                   {"pinned", Trace::num(int64_t{st.pinned})},
                   {"setup_ms", Trace::num(st.setup_seconds * 1e3)},
                   {"pin_ms", Trace::num(st.pin_seconds * 1e3)},
                   {"copy_ms", Trace::num(st.copy_seconds * 1e3)},
                   {"checksum_ms", Trace::num(st.checksum_seconds * 1e3)},
                   {"ms", Trace::num(ms_since(t0))}});
      for (const auto& f : st.failed_attempts)
        std::fprintf(stderr, "gpurun worker (slot %d): warning: pause snapshot fell back: %s\n",
                     slot, f.c_str());
      return "ok";
    } catch (const Error& e) {
      trace.write("snapshot_written", {{"error", Trace::str(e.what())}});
      return e.what();
    }
  }

  // ---- prepared snapshots (docs/worker-runtime.md#snapshot-files) ---------------------
  std::thread prepare_thread;
  std::atomic<bool> prepare_done{false};  // set by prepare_thread when `prepared` is written
  std::optional<rt::StateRegistry::PreparedSnapshot> prepared;
  Clock::time_point prepare_t0;
  std::string prepare_note;  // the lock fallback, said when the file is adopted

  /// One line on stderr (rank 0 only: every rank of the node sees the same /dev/shm and
  /// limits) and the trace.
  void snapshot_note(const std::string& line) {
    trace.write("snapshot_prepared", {{"note", Trace::str(line)}});
    if (rank == 0) std::fprintf(stderr, "gpurun worker (slot %d): %s\n", slot, line.c_str());
  }

  /// After the first optimizer step of an elastic rank's steps() loop, or at its first
  /// `continue` boundary when it uses only epochs() (the optimizer has made its state, so the
  /// size is known), unless GPURUN_SNAPSHOT_PREPARE=0: creates, reserves, maps and locks
  /// (CUDA: cudaHostRegister; CPU: mlock) the pause snapshot file on a background thread, so
  /// that a pause only copies and no boundary waits for it. Skipped, with one line saying so,
  /// when the snapshot path's file system (/dev/shm) has less free space than the file; a CPU
  /// state whose file exceeds RLIMIT_MEMLOCK is prepared without mlock (said too).
  void start_snapshot_preparation() {
    prepare_snapshot = false;
    if (!control || !tracked || registry.empty() || snapshot_path.empty()) return;
    rt::StateRegistry::SnapshotPreparation plan;
    try {
      plan = registry.plan_snapshot_preparation(snapshot_paths(),
                                                /*lock_host_memory=*/!device.is_cuda());
    } catch (const Error& e) {
      trace.write("snapshot_prepared", {{"error", Trace::str(e.what())}});
      return;
    }
    if (plan.done) return;
    if (auto limit = file_size_limit_below(plan.file_bytes)) {
      snapshot_note(fmt::format(
          "note: the pause snapshot is not prepared ahead: {}; a pause is refused until then",
          file_size_limit_text(*limit, plan.file_bytes)));
      return;
    }
    const std::string& primary = plan.paths.front();
    if (::access(primary.c_str(), F_OK) != 0) {  // a new file: it needs the space
      const std::string dir = std::filesystem::path(primary).parent_path().string();
      struct statvfs vfs {};
      if (::statvfs(dir.empty() ? "." : dir.c_str(), &vfs) == 0) {
        const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
        if (free_bytes < plan.file_bytes) {
          snapshot_note(fmt::format(
              "note: the pause snapshot is not prepared ahead: {} has {} MiB free, the state "
              "needs {} MiB; a pause writes it then{} (slower)",
              dir, free_bytes >> 20, (plan.file_bytes + (1 << 20) - 1) >> 20,
              snapshot_fallback_path.empty()
                  ? ""
                  : " (at " + snapshot_fallback_path + " if there is no room)"));
          return;
        }
      }
    }
    if (plan.lock_host_memory) {
      struct rlimit lim {};
      if (::getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
          lim.rlim_cur < plan.file_bytes) {
        plan.lock_host_memory = false;
        prepare_note = fmt::format(
            "note: the pause snapshot file ({} KiB) is prepared but not locked in memory: "
            "RLIMIT_MEMLOCK (ulimit -l) is {} KiB; raise it to lock the file",
            (plan.file_bytes + 1023) >> 10, static_cast<uint64_t>(lim.rlim_cur) >> 10);
      }
    }
    prepare_t0 = Clock::now();
    const at::Device dev = device;
    prepare_thread = std::thread([this, plan = std::move(plan), dev] {
      if (dev.is_cuda()) c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(dev);
      prepared = rt::StateRegistry::make_prepared_snapshot(plan);
      prepare_done.store(true, std::memory_order_release);
    });
  }

  /// Joins the background preparation (waits for it if it still runs) and gives the file to
  /// the registry. Before anything that writes, reads or changes the state's storage.
  void finish_snapshot_preparation() {
    if (!prepare_thread.joinable()) return;
    prepare_thread.join();
    prepare_done.store(false, std::memory_order_relaxed);
    rt::StateRegistry::PreparedSnapshot p = std::move(*prepared);
    prepared.reset();
    const std::string lock_error = p.lock_error;
    try {
      registry.adopt_prepared_snapshot(std::move(p));
    } catch (const Error& e) {
      snapshot_note(
          fmt::format("note: the pause snapshot could not be prepared ahead ({}); a "
                      "pause writes it then (slower)",
                      e.what()));
      return;
    }
    const auto& st = registry.last_snapshot_stats();
    trace.write("snapshot_prepared", {{"path", Trace::str(st.path)},
                                      {"file_bytes", Trace::num(st.file_bytes)},
                                      {"background", "true"},
                                      {"pinned", st.pinned ? "true" : "false"},
                                      {"locked", st.locked ? "true" : "false"},
                                      {"ms", Trace::num(ms_since(prepare_t0))}});
    if (!prepare_note.empty()) {
      snapshot_note(std::exchange(prepare_note, {}));
    } else if (!lock_error.empty()) {
      snapshot_note(fmt::format(
          "note: the pause snapshot file is prepared but not locked in memory: {}", lock_error));
    }
  }

  // ---- a warm joiner maps the pause snapshot while it starts -----------------------------
  std::thread premap_thread;
  std::optional<rt::StateRegistry::PreparedSnapshot> premapped;  // written by premap_thread

  /// A warm joiner (from make_runtime) of a paused job (the node's snapshot file holds a
  /// committed snapshot): maps the file and page-locks it (CUDA) on a thread while the program
  /// builds its model and loads its data, so that the resume only verifies and copies
  /// (ViT-H's 7.5 GB: ~0.9 s of map and cudaHostRegister otherwise inside the resume). The
  /// file is not changed here; adopt_premapped() gives the mapping to the registry, which then
  /// reads the snapshot in it (and writes the next pause into it).
  void start_premap() {
    rt::StateRegistry::SnapshotPreparation plan;
    for (const std::string& p : snapshot_paths().list())
      if (rt::SnapshotHeader::peek_sizes(p, plan.data_end, plan.manifest_bytes)) {
        plan.paths = {p};  // a paused job's snapshot: the one this joiner will read
        break;
      }
    if (plan.paths.empty()) return;
    plan.on_device = device.is_cuda();
    const at::Device dev = device;
    premap_thread = std::thread([this, plan = std::move(plan), dev] {
      if (dev.is_cuda()) c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(dev);
      premapped = rt::StateRegistry::make_prepared_snapshot(plan);
    });
  }

  /// Joins start_premap()'s thread and gives its mapping to the registry (none: nothing).
  void adopt_premapped() {
    if (!premap_thread.joinable()) return;
    premap_thread.join();
    if (premapped && premapped->file) {
      const double ms = premapped->stats.total_seconds * 1e3;
      try {
        registry.adopt_prepared_snapshot(std::move(*premapped));
        trace.write(
            "snapshot_premapped",
            {{"path", Trace::str(registry.last_snapshot_stats().path)}, {"ms", Trace::num(ms)}});
      } catch (const Error& e) {  // read_snapshot maps it itself then
        trace.write("snapshot_premapped", {{"error", Trace::str(e.what())}});
      }
    }
    premapped.reset();
  }

  ~Impl() {
    const auto t0 = Clock::now();
    if (premap_thread.joinable()) premap_thread.join();
    if (prepare_thread.joinable()) prepare_thread.join();
    // The program is done with the runtime: what follows until the process is reaped (its
    // other destructors, the CUDA context's teardown) is outside it (bench/resize_latency.sh).
    trace.write("runtime_end", {{"join_ms", Trace::num(ms_since(t0))}});
  }

  /// After a failed collective: the engine drops the communicator and reports at once (same
  /// position); the supervisor answers without the rank that failed. Returns like boundary().
  bool recover(const std::string& why) {
    trace.write("comm_failure", {{"generation", Trace::num(generation)},
                                 {"epoch", Trace::num(epoch)},
                                 {"step", Trace::num(step_in_epoch)},
                                 {"error", Trace::str(why)}});
    const int64_t epoch_before = epoch;
    control::EngineEvent f;
    f.kind = control::EngineEvent::Kind::kCollectiveFailed;
    f.text = why;
    f.epoch = epoch;
    f.step = step_in_epoch;
    const control::EngineAction last = drive(std::move(f));
    if (finishing) return false;
    if (last.kind == control::EngineAction::Kind::kTrain) after_join(epoch_before);
    return true;
  }

  // ---- steps --------------------------------------------------------------------------
  /// One optimizer step's share of the epoch, dealt from sampler position `s`.
  struct Window {
    int64_t count = 0;  // samples of the whole world: the global batch, less at the end
    std::vector<std::vector<int64_t>> micro_batches;  // this rank's, at most `micro` each
  };
  /// The next step's window, nullopt at the end of the epoch (with drop_last: also before a
  /// last window smaller than the global batch). Global batch: `[batch] global`, else
  /// micro × world.
  std::optional<Window> next_window(const ElasticSampler& s, int64_t micro) const {
    const int64_t g = global_batch > 0 ? global_batch : micro * world;
    const int64_t remaining = s.remaining();
    if (remaining == 0 || (remaining < g && s.options().drop_last)) return std::nullopt;
    Window w;
    w.count = std::min(g, remaining);
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
      if (!recover(err.what()) || !comm || world == 1 || jumped) return false;
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
  void check_global_batch(const ElasticSampler& s) {
    const int64_t samples = s.dataset_size();
    if (global_batch <= 0 || samples == 0 || global_batch <= samples) return;
    if (s.options().drop_last)
      throw Error(fmt::format(
          "[batch] global = {} is larger than the epoch's {} samples and the sampler drops a "
          "step smaller than the global batch (drop_last), so no optimizer step would train; "
          "set [batch] global to at most {} in config.toml, or the sampler's drop_last to false",
          global_batch, samples, samples));
    if (warned_global_batch == global_batch) return;
    warned_global_batch = global_batch;
    if (rank == 0)
      std::fprintf(stderr,
                   "gpurun worker (slot %d): warning: [batch] global = %lld is larger than the "
                   "epoch's %lld samples: each epoch is one optimizer step of %lld samples\n",
                   slot, static_cast<long long>(global_batch), static_cast<long long>(samples),
                   static_cast<long long>(samples));
  }

  void build_step() {
    step_valid = false;
    if (!sampler) throw Error("Runtime::steps(): call Runtime::sampler() first");
    if (finishing || epoch != range_epoch) return;
    if (sampler->epoch() != epoch) sampler->set_epoch(epoch);
    check_global_batch(*sampler);
    std::optional<Window> w = next_window(*sampler, range_micro);
    if (!w) return;
    step_count = w->count;
    step.epoch = epoch;
    step.index = step_in_epoch;
    step.global_step = global_step;
    step.global_samples = step_count;
    step.world_size = world;
    step.micro_batches = std::move(w->micro_batches);
    step_valid = true;
  }

  void next_step() {
    sampler->advance(step_count);
    ++step_in_epoch;
    ++global_step;
    if (progress) progress->step(static_cast<uint64_t>(global_step));
    step_valid = false;
    // The optimizer made its state in this first step (AdamW: lazily): the pause snapshot's
    // size is known, so its file is prepared from here on, not only at the first boundary.
    if (prepare_snapshot && control) start_snapshot_preparation();
    const bool epoch_left = sampler->remaining() > 0;
    if (every_steps > 0 && step_in_epoch % every_steps == 0 && epoch_left) {
      if (!boundary(epoch, step_in_epoch)) return;
    }
    build_step();
  }
};

// ---- Runtime ---------------------------------------------------------------------------

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Runtime::~Runtime() = default;

std::unique_ptr<Runtime> Runtime::from_env(RuntimeOptions options) {
  // A peer that dies leaves half-open sockets: writing to one must surface as a CommError
  // (survivors go on), not kill this process with SIGPIPE. Left alone if the program set its
  // own handler.
  struct sigaction pipe {};
  if (::sigaction(SIGPIPE, nullptr, &pipe) == 0 && pipe.sa_handler == SIG_DFL)
    ::signal(SIGPIPE, SIG_IGN);
  detail::RuntimeSeams seams;
  seams.options = std::move(options);
  seams.env = rt::RuntimeEnv::from_env();
  // Preemption (docs/cli.md#preemption): catch gpurun's warning signal (its default action
  // would end the process) unless the program handles it, then tell gpurun that this process
  // group's runtime stops at a boundary when asked (runtime.<pgid>).
  if (seams.env.preempt_signal > 0) {
    struct sigaction cur {};
    if (::sigaction(seams.env.preempt_signal, nullptr, &cur) == 0 && cur.sa_handler == SIG_DFL) {
      struct sigaction sa {};
      sa.sa_handler = on_preempt_signal;
      sa.sa_flags = SA_RESTART;
      sigemptyset(&sa.sa_mask);
      ::sigaction(seams.env.preempt_signal, &sa, nullptr);
    }
  }
  if (!seams.env.preempt_dir.empty() && std::getenv("SLURM_JOB_ID") != nullptr) {
    struct sigaction cur {};
    if (::sigaction(SIGTERM, nullptr, &cur) == 0 && cur.sa_handler == SIG_DFL) {
      struct sigaction sa {};
      sa.sa_sigaction = on_term_signal;
      sa.sa_flags = SA_RESTART | SA_SIGINFO;
      sigemptyset(&sa.sa_mask);
      ::sigaction(SIGTERM, &sa, nullptr);
    }
  }
  if (!seams.env.preempt_dir.empty()) {
    const std::string ack =
        fmt::format("{}/runtime.{}", seams.env.preempt_dir, static_cast<long>(::getpgrp()));
    const int fd = ::open(ack.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) ::close(fd);  // without it gpurun forwards SIGTERM at once: nothing is lost
  }
  seams.progress = control::ProgressWriter::from_env();
  seams.control = control::WorkerSession::from_env();
  const rt::CommBackend backend = seams.env.cuda ? rt::CommBackend::kNccl : rt::CommBackend::kGloo;
  if ((seams.env.world > 1 || seams.control) && !rt::comm_backend_available(backend))
    throw Error(
        fmt::format("this build of the gpurun worker runtime has no {} communicator "
                    "(device {})",
                    rt::to_string(backend), seams.env.cuda ? "cuda" : "cpu"));
  seams.make_comm = &rt::make_communicator;
  return detail::make_runtime(std::move(seams));
}

std::unique_ptr<Runtime> detail::make_runtime(RuntimeSeams seams) {
  auto m = std::make_unique<Runtime::Impl>();
  const rt::RuntimeEnv& e = seams.env;
  m->opt = std::move(seams.options);
  if (e.comm_timeout) m->opt.comm_timeout = *e.comm_timeout;
  m->slot = e.slot;
  if (e.cuda) {
    m->device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(m->slot));
    m->backend = rt::CommBackend::kNccl;
  }
  m->store = e.store;
  m->restart_count = e.restart_count;
  m->snapshot_path = e.snapshot_path;
  m->snapshot_fallback_path = e.snapshot_fallback_path;
  m->prepare_snapshot = e.prepare_snapshot;
  m->preempt_dir = e.preempt_dir;
  m->preempt_seen = g_preempt_signals.load(std::memory_order_relaxed);
  const std::string trace_dir = !m->opt.trace_dir.empty() ? m->opt.trace_dir : e.trace_dir;
  if (!trace_dir.empty()) m->trace = Trace(trace_dir, m->slot);
  m->comm_factory = seams.make_comm ? std::move(seams.make_comm) : &rt::make_communicator;
  m->on_state = std::move(seams.on_state);
  m->standby_exit = std::move(seams.standby_exit);
  m->progress = std::move(seams.progress);
  m->control = std::move(seams.control);
  // The device is set up now, or by a standby's first device() call (ensure_device).
  m->device_pending = true;
  if (!m->control || !m->control->engine().standby()) m->ensure_device();
  if (m->control && m->control->engine().warm()) {
    // A warm joiner: started before any decision names it. Until gpurun admits it (at its first
    // epochs()/steps(), ensure_started()) it is in no generation: generation() is -1, rank()
    // and world_size() are the provisional ones of its environment.
    m->state = WorkerState::kRejoining;
    m->generation = -1;
    m->rank = e.rank;
    m->world = e.world;
    m->active.clear();
    control::EngineEvent open;  // in no generation until admitted: the engine only notes it
    open.kind = control::EngineEvent::Kind::kOpen;
    m->drive(std::move(open));
    if (!m->control->engine().standby()) m->start_premap();  // a standby's: once told to go
  } else if (m->control) {
    m->state = WorkerState::kRejoining;  // initial state: a joiner until it holds the state
    control::EngineEvent open;
    open.kind = control::EngineEvent::Kind::kOpen;
    m->drive(std::move(open));  // reads its generation's start record, writes `joined`
    const Decision& d = m->control->engine().current();
    m->adopt(d);
    if (m->rank < 0)
      throw Error(fmt::format("slot {} is not a member of generation {}", m->slot, d.generation));
  } else {
    m->rank = e.rank;
    m->world = e.world;
    if (m->world < 1 || m->rank < 0 || m->rank >= m->world)
      throw Error(fmt::format("environment: RANK={} is not in WORLD_SIZE={}", m->rank, m->world));
    m->active.clear();
    for (int r = 0; r < m->world; ++r) m->active.push_back(r);
  }
  // Whose tracked state survives the start (enter(), static_boundary()): the decision's state
  // source, rank 0 at a fresh start or in a static job; a warm joiner always receives it.
  if (m->control) {
    m->joining = m->control->engine().joining();
  } else {
    m->joining = m->world > 1 && m->rank != 0;
  }
  m->trace.write("start", {{"gpu", Trace::num(int64_t{m->slot})},
                           {"generation", Trace::num(m->generation)},
                           {"rank", Trace::num(int64_t{m->rank})},
                           {"world", Trace::num(int64_t{m->world})},
                           {"device", Trace::str(m->device.str())}});
  return std::unique_ptr<Runtime>(new Runtime(std::move(m)));
}

at::Device Runtime::device() const {
  impl_->ensure_device();
  return impl_->device;
}
int Runtime::rank() const {
  return impl_->rank;
}
int Runtime::world_size() const {
  return impl_->world;
}
int64_t Runtime::generation() const {
  return impl_->generation;
}
int Runtime::gpu_id() const {
  return impl_->slot;
}
bool Runtime::elastic() const {
  return impl_->control != nullptr;
}
WorkerState Runtime::state() const {
  return impl_->state;
}
bool Runtime::joining() const {
  return impl_->joining;
}
bool Runtime::left() const {
  return impl_->state == WorkerState::kExited;
}
bool Runtime::checkpoint_requested() const {
  return impl_->checkpoint_req;
}
bool Runtime::stop_requested() const {
  return impl_->stop_req;
}
std::vector<int> Runtime::active_gpus() const {
  return impl_->active;
}

void Runtime::track(torch::nn::Module& module, torch::optim::Optimizer& optimizer) {
  track(module);
  impl_->registry.track_optimizer(optimizer);
}

void Runtime::track(torch::nn::Module& module) {
  Impl& m = *impl_;
  if (m.tracked) throw Error("Runtime::track(): the state is already tracked (call it once)");
  m.registry.track_module(module);
  m.registry.track_scalar("gpurun.epoch", &m.epoch);
  m.registry.track_scalar("gpurun.step_in_epoch", &m.step_in_epoch);
  m.registry.track_scalar("gpurun.global_step", &m.global_step);
  m.registry.track_scalar("gpurun.sampler.epoch", &m.sampler_epoch);
  m.registry.track_scalar("gpurun.sampler.cursor", &m.sampler_cursor);
  std::vector<at::Tensor> params;  // those that take part in gradient averaging
  for (const at::Tensor& p : module.parameters())
    if (p.requires_grad()) params.push_back(p);
  m.grads = std::make_unique<rt::GradientSync>(std::move(params), m.opt.bucket_bytes);
  m.tracked = true;
}

void Runtime::track_scalar(const std::string& name, int64_t* value) {
  impl_->registry.track_scalar(name, value);
}
void Runtime::track_scalar(const std::string& name, double* value) {
  impl_->registry.track_scalar(name, value);
}
void Runtime::track_extension(const std::string& name, std::shared_ptr<StateExtension> extension) {
  impl_->registry.track_extension(name, std::move(extension));
}

ElasticSampler& Runtime::sampler(int64_t dataset_size, ElasticSamplerOptions options) {
  Impl& m = *impl_;
  if (m.sampler) throw Error("Runtime::sampler(): already created (call it once)");
  if (m.started) throw Error("Runtime::sampler(): call it before epochs()");
  m.sampler.emplace(dataset_size, options);
  return *m.sampler;
}

Runtime::EpochRange Runtime::epochs(int64_t max_epochs) {
  impl_->max_epochs = max_epochs;
  impl_->ensure_started();
  EpochRange r;
  r.rt = impl_.get();
  r.max_epochs = max_epochs;
  return r;
}

Runtime::StepRange Runtime::steps(int64_t micro_batch) {
  if (micro_batch < 1)
    throw Error(fmt::format("Runtime::steps(): micro_batch {} < 1", micro_batch));
  impl_->ensure_started();
  StepRange r;
  r.rt = impl_.get();
  r.micro_batch = micro_batch;
  return r;
}

std::vector<std::vector<int64_t>> Runtime::upcoming_micro_batches(int64_t micro_batch) const {
  const Impl& m = *impl_;
  if (micro_batch < 1)
    throw Error(fmt::format("Runtime::upcoming_micro_batches(): micro_batch {} < 1", micro_batch));
  if (!m.sampler) throw Error("Runtime::upcoming_micro_batches(): call Runtime::sampler() first");
  ElasticSampler s = *m.sampler;  // a copy: planning changes nothing
  if (s.epoch() != m.epoch) s.set_epoch(m.epoch);
  std::vector<std::vector<int64_t>> out;
  for (int64_t done = m.step_in_epoch;;) {
    std::optional<Impl::Window> w = m.next_window(s, micro_batch);
    if (!w) break;
    for (auto& mb : w->micro_batches) out.push_back(std::move(mb));
    s.advance(w->count);
    ++done;
    if (m.every_steps > 0 && done % m.every_steps == 0) break;
  }
  return out;
}

void Runtime::all_reduce_gradients() {
  Impl& m = *impl_;
  m.ensure_started();
  // After a hold-mode rejoin at another epoch the rest of the old epoch's body runs alone.
  if (!m.comm || m.world == 1 || m.jumped) return;
  // A peer that dies mid-step: the survivors go on; this step's gradient is averaged over them
  // (the failed rank's samples of this step are not trained on).
  m.run_collective([&] { m.grads->average(); });
}

std::vector<double> Runtime::all_reduce_sum(std::vector<double> values) {
  Impl& m = *impl_;
  m.ensure_started();
  if (!m.comm || values.empty() || m.jumped) return values;
  const std::vector<double> mine = values;
  // A peer that dies: the sum is over the survivors (docs/worker-runtime.md, Failures).
  const bool summed = m.run_collective([&] {
    values = mine;
    at::Tensor t = at::from_blob(values.data(), {static_cast<int64_t>(values.size())},
                                 at::TensorOptions().dtype(at::kDouble))
                       .to(m.device, /*non_blocking=*/false, /*copy=*/true);
    m.comm->all_reduce_sum(t);
    m.comm->synchronize();
    t = t.to(at::kCPU).contiguous();
    std::memcpy(values.data(), t.data_ptr<double>(), values.size() * sizeof(double));
  });
  return summed ? values : mine;
}

uint64_t Runtime::state_checksum() {
  if (left()) {
    if (impl_->left_checksum) return *impl_->left_checksum;
    throw rt::StateError(fmt::format(
        "state_checksum(): this rank left the job in generation {} and its tracked tensors are "
        "freed; only a rank that wrote the pause snapshot or handed the state on knows the "
        "checksum it left with (docs/worker-runtime.md: the code after the loop)",
        impl_->generation));
  }
  impl_->sync_out();
  return impl_->registry.checksum();
}

void Runtime::run(int64_t max_epochs, const std::function<void(int64_t)>& train_one_epoch) {
  for (int64_t e : epochs(max_epochs)) train_one_epoch(e);
}

// ---- ranges ----------------------------------------------------------------------------

Runtime::EpochRange::iterator Runtime::EpochRange::begin() {
  iterator it;
  it.rt = rt;
  return it;
}

int64_t Runtime::EpochRange::iterator::operator*() const {
  return rt->epoch;
}

Runtime::EpochRange::iterator& Runtime::EpochRange::iterator::operator++() {
  Impl& m = *rt;
  if (m.jumped) {  // already past a boundary (rejoined at another position)
    m.jumped = false;
    return *this;
  }
  const int64_t finished = m.epoch;
  ++m.epoch;
  m.step_in_epoch = 0;
  if (m.sampler) m.sampler->set_epoch(m.epoch);
  if (m.epoch < m.max_epochs) m.boundary(finished, 0);
  m.jumped = false;  // the position after this boundary is where the loop goes on
  return *this;
}

bool Runtime::EpochRange::iterator::operator==(std::default_sentinel_t) const {
  return rt->finishing || rt->epoch >= rt->max_epochs;
}

Runtime::StepRange::iterator Runtime::StepRange::begin() {
  rt->range_epoch = rt->epoch;
  rt->range_micro = micro_batch;
  rt->build_step();
  iterator it;
  it.rt = rt;
  return it;
}

const Step& Runtime::StepRange::iterator::operator*() const {
  GPURUN_CHECK(rt->step_valid, "dereferencing a finished StepRange");
  return rt->step;
}

Runtime::StepRange::iterator& Runtime::StepRange::iterator::operator++() {
  rt->next_step();
  return *this;
}

bool Runtime::StepRange::iterator::operator==(std::default_sentinel_t) const {
  return !rt->step_valid;
}

}  // namespace gpurun
