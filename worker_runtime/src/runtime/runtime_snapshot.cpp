// gpurun::Runtime::Impl's pause snapshots (docs/worker-runtime.md#snapshot-files): written at a
// pause, read at a resume, prepared while training runs, premapped by a warm joiner; and the
// leaving rank's release (release mode) or park (hold mode) of its GPU state.
#include "runtime/runtime_impl.hpp"

namespace gpurun {

void Runtime::Impl::read_pause_snapshot(int64_t want_epoch, int64_t want_step) {
  registry.read_snapshot(snapshot_paths(), device, rt::StateRegistry::Verify::kWhileCopying,
                         reserve_ahead);
  if (want_epoch >= 0 && (epoch != want_epoch || step_in_epoch != want_step)) {
    const std::string path = registry.last_snapshot_stats().path;
    registry.release();
    throw rt::StateError(fmt::format(
        "the pause snapshot {} holds the state {}, but the pause it resumes was {}: refusing "
        "to roll training back (was an older snapshot copied over it?)",
        path, control::position_text(epoch, step_in_epoch),
        control::position_text(want_epoch, want_step)));
  }
  sync_in();
  const auto& st = registry.last_snapshot_stats();
  trace.write("snapshot_read",
              {{"path", Trace::str(st.path)},
               {"bytes", Trace::num(st.file_bytes)},
               {"pinned", Trace::num(int64_t{st.pinned})},
               {"setup_ms", Trace::num(st.setup_seconds * 1e3)},
               {"pin_ms", Trace::num(st.pin_seconds * 1e3)},
               {"copy_ms", Trace::num(st.copy_seconds * 1e3)},
               {"checksum_ms", Trace::num(st.checksum_seconds * 1e3)},
               {"reserve_hint", Trace::num(static_cast<int64_t>(st.device_reserved_hint))},
               {"reserved", Trace::num(static_cast<int64_t>(st.reserved_ahead_bytes))},
               {"reserve_ms", Trace::num(st.reserve_seconds * 1e3)},
               {"ms", Trace::num(st.total_seconds * 1e3)}});
  if (!st.reserve_note.empty())
    std::fprintf(stderr,
                 "gpurun worker (slot %d): note: device memory reserved ahead of the first step: "
                 "%llu of %llu bytes (%s)\n",
                 slot, static_cast<unsigned long long>(st.reserved_ahead_bytes),
                 static_cast<unsigned long long>(st.device_reserved_hint), st.reserve_note.c_str());
}

void Runtime::Impl::offload_common(const std::string& role) {
  finish_warm_up();  // (a leaver before its first step) its tensors are freed before the cache
  left_checksum = last_checksum ? last_checksum : written_checksum;
  trace_resize(control->engine().current(), role, moved_bytes, last_checksum);
  comm.reset();
  handoff.reset();
  if (grads) {
    grads->set_communicator(nullptr);
    grads->release();
  }
}

void Runtime::Impl::release_state(const std::string& role) {
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

void Runtime::Impl::park_state(const std::string& role) {
  const auto t0 = Clock::now();
  offload_common(role);
  registry.release();
  if (device.is_cuda()) rt::compat::release_cached_device_memory();
  trace.write("parked",
              {{"ms", Trace::num(ms_since(t0))}, {"device_bytes", Trace::num(registry.nbytes())}});
}

std::string Runtime::Impl::write_pause_snapshot() {
  finish_warm_up();
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
                 {"device_reserved", Trace::num(static_cast<int64_t>(st.device_reserved_hint))},
                 {"ms", Trace::num(ms_since(t0))}});
    for (const auto& f : st.failed_attempts)
      std::fprintf(stderr, "gpurun worker (slot %d): warning: pause snapshot fell back: %s\n", slot,
                   f.c_str());
    return "ok";
  } catch (const Error& e) {
    trace.write("snapshot_written", {{"error", Trace::str(e.what())}});
    return e.what();
  }
}

void Runtime::Impl::snapshot_note(const std::string& line) {
  trace.write("snapshot_prepared", {{"note", Trace::str(line)}});
  if (rank == 0) std::fprintf(stderr, "gpurun worker (slot %d): %s\n", slot, line.c_str());
}

void Runtime::Impl::start_snapshot_preparation() {
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

void Runtime::Impl::finish_snapshot_preparation() {
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

void Runtime::Impl::start_premap(bool map_only) {
  // A standby's map-only thread from before its go: the new thread joins it and page-locks its
  // mapping if the file is still the one mapped (not this thread: the go's CUDA set-up goes on).
  std::thread earlier = std::move(premap_thread);
  premap_map_only = map_only;
  rt::StateRegistry::SnapshotPreparation plan;
  for (const std::string& p : snapshot_paths().list())
    if (rt::SnapshotHeader::peek_sizes(p, plan.data_end, plan.manifest_bytes)) {
      plan.paths = {p};  // a paused job's snapshot: the one this joiner will read
      break;
    }
  if (plan.paths.empty()) {  // nothing to read (any more): the early mapping is dropped
    if (earlier.joinable()) earlier.join();
    premapped.reset();
    return;
  }
  plan.on_device = !map_only && device.is_cuda();
  const at::Device dev = device;
  premap_thread = std::thread(
      [this, plan = std::move(plan), dev, map_only, earlier = std::move(earlier)]() mutable {
        rt::StateRegistry::PreparedSnapshot early;  // none: finish maps the file itself
        if (earlier.joinable()) {
          earlier.join();
          if (premapped) early = std::move(*premapped);
          premapped.reset();
        }
        if (plan.on_device) c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(dev);
        premapped = snapshot::finish_prepared_snapshot(std::move(early), plan);
        // A standby's mapping, done while it waits: all it does ahead of its go is done now.
        if (map_only)
          trace.write("standby_mapped",
                      {{"path", Trace::str(plan.paths.front())},
                       {"ms", Trace::num(premapped->stats.total_seconds * 1e3)},
                       {"error", Trace::str(premapped->file ? "" : premapped->error)}});
      });
}

void Runtime::Impl::adopt_premapped() {
  if (!premap_thread.joinable() || premap_map_only) return;  // a standby's: pinned at its go
  premap_thread.join();
  if (premapped && premapped->file) {
    const double ms = premapped->stats.total_seconds * 1e3;
    try {
      registry.adopt_prepared_snapshot(std::move(*premapped));
      trace.write("snapshot_premapped", {{"path", Trace::str(registry.last_snapshot_stats().path)},
                                         {"ms", Trace::num(ms)}});
    } catch (const Error& e) {  // read_snapshot maps it itself then
      trace.write("snapshot_premapped", {{"error", Trace::str(e.what())}});
    }
  }
  premapped.reset();
}

}  // namespace gpurun
