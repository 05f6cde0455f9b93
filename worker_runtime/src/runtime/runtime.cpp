// gpurun::Runtime: the boundary loop, the worker engine's actions executed with LibTorch, the
// steps, and the start (from_env / make_runtime). Snapshots: runtime_snapshot.cpp; the public
// methods and the loop ranges: runtime_api.cpp; the shared state: runtime_impl.hpp.
// Protocol: docs/control-protocol.md; behaviour: docs/worker-runtime.md.
#include "runtime/runtime_impl.hpp"

#include "gpurun/control/keys.hpp"
#include "gpurun/worker/library_preload.hpp"
#include "gpurun/worker/term_signal.hpp"
#include "runtime/cuda_warmup.hpp"
#include "state/state_checksum.hpp"

#include <c10/core/DeviceGuard.h>

namespace gpurun {

namespace rt {
std::atomic<uint64_t> g_preempt_signals{0};
}  // namespace rt

namespace {

extern "C" void on_preempt_signal(int) {
  g_preempt_signals.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

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

// ---- Runtime::Impl: the engine's executor ----------------------------------------------

std::unique_ptr<Communicator> Runtime::Impl::make_static_comm(const std::vector<int>& group) {
  rt::CommOptions o;
  o.store = store;
  o.prefix = control::keys::static_comm(restart_count);
  o.rank = rank;
  o.size = static_cast<int>(group.size());
  o.device = device;
  o.timeout = opt.comm_timeout;
  return comm_factory(backend, o);
}

std::unique_ptr<Communicator> Runtime::Impl::make_comm(const control::EngineAction& a) {
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

int64_t Runtime::Impl::broadcast_state(Communicator& c, int root) {
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

uint64_t Runtime::Impl::verify(Communicator& c, int root, const std::string& what) {
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

control::EngineAction Runtime::Impl::drive(control::EngineEvent e) {
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

std::optional<control::EngineEvent> Runtime::Impl::execute(const control::EngineAction& a) {
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
      finish_warm_up();  // nothing of the device's runs on another thread past here
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
      registry.drop_receive_reserve();  // a warm joiner that received no state
      train_on(a);
      return std::nullopt;
    case K::kExit:
      finishing = true;
      checkpoint_req = false;
      if (!a.left) {
        stop_req = a.stop;  // the session saw gpurun's stop file
        if (stop_req)
          trace.write("stop", {{"epoch", Trace::num(epoch)}, {"step", Trace::num(step_in_epoch)}});
      }
      return std::nullopt;
    case K::kSet:
    case K::kWaitGet:  // WorkerSession runs these
      break;
  }
  throw InvariantError(
      fmt::format("slot {}: unexpected engine action {}", slot, control::to_string(a.kind)));
}

void Runtime::Impl::train_on(const control::EngineAction& a) {
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
  // What the program reads about its place in the job is this generation's (RANK, WORLD_SIZE,
  // LOCAL_RANK, …): set before its next step. A `continue` changes none of them.
  if (export_env) export_env(a.env);
  // The warm-up is not waited for here: the first step runs beside what is left of it and
  // joins it at its end (next_step). A standby's warm-up runs beside the snapshot's
  // page-locking and copies; waiting here cost the C++ ViT-H resume 374 ms (H100,
  // 2026-12-05, docs/results.md tenth day).
  if (grads) grads->set_communicator(comm.get());
  trace_resize(d, a.role, moved_bytes, last_checksum);
  first_step_pending = true;
  moved_bytes = 0;
  last_checksum.reset();
  setup_t0 = {};
}

void Runtime::Impl::ensure_device() {
  if (!device_pending) return;
  device_pending = false;
  if (control && control->engine().standby()) {
    const auto t0 = Clock::now();
    trace.write("standby", {{"gpu", Trace::num(int64_t{slot})}});
    std::fprintf(stderr,
                 "gpurun worker (slot %d): standby: waiting for a config that names this slot "
                 "(no CUDA context yet)\n",
                 slot);
    standby_ahead();
    control::EngineEvent ev;
    ev.kind = control::EngineEvent::Kind::kDevice;
    drive(std::move(ev));
    if (finishing) {  // told to exit: it holds nothing, and its program must not go on
      if (premap_thread.joinable()) premap_thread.join();  // not unmapped under std::exit
      trace.write("standby_exit", {{"gpu", Trace::num(int64_t{slot})}});
      if (standby_exit) standby_exit();
      std::exit(0);
    }
    trace.write("standby_go", {{"waited_ms", Trace::num(ms_since(t0))}});
    std::fprintf(stderr,
                 "gpurun worker (slot %d): standby told to go after %.1f s; setting up %s\n", slot,
                 ms_since(t0) / 1000.0, device.str().c_str());
    start_premap();
  }
  if (device.is_cuda()) {
    if (!torch::cuda::is_available())
      throw Error(
          fmt::format("{}=cuda but LibTorch sees no CUDA device for slot {}'s {} (a CPU-only "
                      "LibTorch, or CUDA_VISIBLE_DEVICES is empty)",
                      env::kDevice, slot, device.str()));
    c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(device);
  }
  if (control) start_warm_up();
}

void Runtime::Impl::standby_ahead() {
  if (device.is_cuda()) {
    try {
      const control::PreloadResult r =
          control::preload_libraries_beside(control::cuda_library_families());
      // The CUDA driver's own start (cuInit, through cudaGetDeviceCount; at most ~0.25 s on the
      // H200 by the warm-up thread's start after a go, 2026-12-05), which makes no context:
      // nvidia-smi lists nothing and the GPU stays at 0 MiB. The go's check below then returns at
      // once; its error, if any, is said there.
      const auto t_driver = Clock::now();
      (void)torch::cuda::is_available();
      trace.write("standby_preload", {{"loaded", Trace::num(int64_t{r.loaded})},
                                      {"failed", Trace::num(static_cast<int64_t>(r.failed.size()))},
                                      {"ms", Trace::num(r.seconds * 1e3)},
                                      {"driver_ms", Trace::num(ms_since(t_driver))}});
      for (const std::string& f : r.failed)  // only slower: the library opens it itself later
        std::fprintf(stderr, "gpurun worker (slot %d): note: standby: cannot preload %s\n", slot,
                     f.c_str());
    } catch (const std::exception& e) {  // an optimisation only: the standby goes on
      std::fprintf(stderr, "gpurun worker (slot %d): note: standby: preloading failed: %s\n", slot,
                   e.what());
    }
  }
  start_premap(/*map_only=*/true);
}

void Runtime::Impl::start_warm_up() {
  if (warm_thread.joinable()) return;
  std::function<void(const at::Device&)> fn = warm_up;  // a test's, else the real one (CUDA)
  if (!fn && device.is_cuda()) {
    fn = [](const at::Device& d) {
      // Every elastic process checksums its state at its first generation (a joiner right
      // after the handoff, with its peers waiting); every one trains after.
      rt::warm_checksum_kernels(d);
      rt::warm_cuda_libraries(d);
    };
  }
  if (!fn) return;
  const auto t0 = Clock::now();
  warm_thread = std::thread([this, t0, fn = std::move(fn)] {
    try {
      const c10::DeviceGuard on_device(device);
      // A side stream: the warm-up waits for none of the program's or the handoff's kernels
      // (the destructor joins this thread before it aborts a communicator).
      std::optional<c10::StreamGuard> side;
      if (device.is_cuda())
        side.emplace(c10::impl::getDeviceGuardImpl(at::kCUDA)->getStreamFromGlobalPool(device));
      fn(device);
      trace.write("warmed_up", {{"ms", Trace::num(ms_since(t0))}});
    } catch (const std::exception& e) {
      warm_error = e.what();
    }
  });
}

void Runtime::Impl::finish_warm_up() {
  if (!warm_thread.joinable()) return;
  if (warm_up_waited) warm_up_waited();
  warm_thread.join();
  if (!warm_error.empty())
    std::fprintf(stderr,
                 "gpurun worker (slot %d): warning: setting up the CUDA libraries ahead of the "
                 "first step failed (%s); the first step sets them up instead\n",
                 slot, warm_error.c_str());
  warm_error.clear();
}

void Runtime::Impl::ensure_started() {
  if (started) return;
  ensure_device();
  GPURUN_CHECK(tracked, "Runtime::track() must be called before epochs()/steps()");
  started = true;
  if (control) {
    // An elastic process starts REJOINING (make_runtime): a joiner until it holds the
    // state. A warm joiner is ready here (model built and tracked, data loaded): the engine
    // says so and waits, without a deadline, for gpurun to admit it (or to say exit).
    if (control->engine().warm() && !control->engine().standby()) {
      // The handoff's receive buffers, written once now rather than faulted in by the receive
      // with every peer waiting (CPU only: see StateRegistry::reserve_receive).
      const auto t_reserve = Clock::now();
      if (const int64_t reserved = registry.reserve_receive(device); reserved > 0)
        trace.write("receive_reserve",
                    {{"bytes", Trace::num(reserved)}, {"ms", Trace::num(ms_since(t_reserve))}});
    }
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

bool Runtime::Impl::boundary(int64_t report_epoch, int64_t report_step) {
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

bool Runtime::Impl::static_boundary() {
  if (preempt_dir.empty()) return true;
  int64_t mine = 0;
  const uint64_t n = g_preempt_signals.load(std::memory_order_relaxed);
  if (n != preempt_seen) {
    preempt_seen = n;
    mine |= 1;
  }
  if (stop_file_exists() || control::external_term_seen()) mine |= 2;
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

bool Runtime::Impl::recover(const std::string& why) {
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

void Runtime::Impl::check_global_batch(const ElasticSampler& s) {
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

void Runtime::Impl::build_step() {
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

void Runtime::Impl::next_step() {
  sampler->advance(step_count);
  ++step_in_epoch;
  ++global_step;
  if (progress) progress->step(static_cast<uint64_t>(global_step));
  step_valid = false;
  if (std::exchange(first_step_pending, false)) {
    finish_warm_up();  // no use after the first step; its failure is said now
    trace.write("first_step",
                {{"generation", Trace::num(generation)}, {"step", Trace::num(global_step)}});
  }
  // The optimizer made its state in this first step (AdamW: lazily): the pause snapshot's
  // size is known, so its file is prepared from here on, not only at the first boundary.
  if (prepare_snapshot && control) start_snapshot_preparation();
  const bool epoch_left = sampler->remaining() > 0;
  if (every_steps > 0 && step_in_epoch % every_steps == 0 && epoch_left) {
    if (!boundary(epoch, step_in_epoch)) return;
  }
  build_step();
}

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
  // Under Slurm a SIGTERM from slurmstepd reaches this process too: it waits for gpurun's
  // stop at the next boundary instead of ending here (gpurun/worker/term_signal.hpp).
  control::install_external_term_handler();
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
  if (seams.control) seams.export_env = &rt::export_env;  // elastic: the generation's values
  return detail::make_runtime(std::move(seams));
}

std::unique_ptr<Runtime> detail::make_runtime(RuntimeSeams seams) {
  auto m = std::make_unique<Runtime::Impl>();
  const rt::RuntimeEnv& e = seams.env;
  m->opt = std::move(seams.options);
  if (e.comm_timeout) m->opt.comm_timeout = *e.comm_timeout;
  m->slot = e.slot;
  if (e.cuda) {
    m->device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(e.local_slot));
    m->backend = rt::CommBackend::kNccl;
  }
  m->store = e.store;
  m->restart_count = e.restart_count;
  m->snapshot_path = e.snapshot_path;
  m->snapshot_fallback_path = e.snapshot_fallback_path;
  m->prepare_snapshot = e.prepare_snapshot;
  m->reserve_ahead = e.reserve_ahead;
  m->preempt_dir = e.preempt_dir;
  m->preempt_seen = g_preempt_signals.load(std::memory_order_relaxed);
  const std::string trace_dir = !m->opt.trace_dir.empty() ? m->opt.trace_dir : e.trace_dir;
  if (!trace_dir.empty()) m->trace = Trace(trace_dir, m->slot);
  m->comm_factory = seams.make_comm ? std::move(seams.make_comm) : &rt::make_communicator;
  m->on_state = std::move(seams.on_state);
  m->standby_exit = std::move(seams.standby_exit);
  m->warm_up = std::move(seams.warm_up);
  m->warm_up_waited = std::move(seams.warm_up_waited);
  m->export_env = std::move(seams.export_env);
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

}  // namespace gpurun
