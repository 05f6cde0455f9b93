// Every GPURUN_* environment variable gpurun reads or sets, by name, in one place. The
// supervisor sets the worker ones (launcher/supervisor/worker_env.cpp,
// launcher/control/elastic_controller.cpp, launcher/app/main.cpp); the worker side reads
// them (gpurun/worker/worker_session.hpp, gpurun/control/progress.hpp, the worker runtime).
// Meaning of each: docs/cli.md#worker-environment.
#pragma once

namespace gpurun::env {

// --- set by gpurun for every worker -------------------------------------------------------
inline constexpr const char* kRunId = "GPURUN_RUN_ID";          ///< TORCHELASTIC_RUN_ID
inline constexpr const char* kStoreAddr = "GPURUN_STORE_ADDR";  ///< the supervisor's store
inline constexpr const char* kStorePort = "GPURUN_STORE_PORT";  ///< its TCP port
/// The job slot id (keys, reports): node k's local slot i is k*1000+i (control::job_slot)
inline constexpr const char* kSlot = "GPURUN_SLOT";
/// The node-local slot: the device index (cuda:<i>) and LOCAL_RANK at spawn; absent: = kSlot
inline constexpr const char* kLocalSlot = "GPURUN_LOCAL_SLOT";
inline constexpr const char* kDevice = "GPURUN_DEVICE";               ///< "cuda" or "cpu"
inline constexpr const char* kGpuId = "GPURUN_GPU_ID";                ///< the slot's GPU (cuda)
inline constexpr const char* kRunDir = "GPURUN_RUN_DIR";              ///< <run_dir> of the job
inline constexpr const char* kSnapshotPath = "GPURUN_SNAPSHOT_PATH";  ///< pause snapshot file
inline constexpr const char* kProgressFile = "GPURUN_PROGRESS_FILE";  ///< step-progress map
/// libgpurun_worker.so of this gpurun: the worker engine's C interface (Python package)
inline constexpr const char* kWorkerLibrary = "GPURUN_WORKER_LIBRARY";
// --- set by gpurun --config (elastic mode) --------------------------------------------------
inline constexpr const char* kElastic = "GPURUN_ELASTIC";  ///< "1": follow the control protocol
inline constexpr const char* kJoinGeneration = "GPURUN_JOIN_GENERATION";  ///< first generation
inline constexpr const char* kActiveGpus = "GPURUN_ACTIVE_GPUS";  ///< "0,1,…" at spawn time
/// A warm joiner's id <w> (instead of kJoinGeneration): it gets ready, then waits for its admit key
inline constexpr const char* kWarm = "GPURUN_WARM";
/// "1" with kWarm: a standby ([park] standby): it starts up without the device and waits for
/// its go key when its program first needs the device (docs/control-protocol.md#standby)
inline constexpr const char* kStandby = "GPURUN_STANDBY";
inline constexpr const char* kParkMode = "GPURUN_PARK_MODE";  ///< "release" or "hold"
/// The absolute path of --config (the file gpurun watches); the Python decorator compares its
/// own config_path with it.
inline constexpr const char* kConfig = "GPURUN_CONFIG";
// --- read by the worker runtime, set by the user or a test ----------------------------------
inline constexpr const char* kCommTimeoutMs = "GPURUN_COMM_TIMEOUT_MS";     ///< collective deadline
inline constexpr const char* kSnapshotPrepare = "GPURUN_SNAPSHOT_PREPARE";  ///< "1": pre-create
inline constexpr const char* kTraceDir = "GPURUN_TRACE_DIR";  ///< per-rank boundary traces
/// "0": a resume from a pause snapshot does not grow the CUDA caching allocator to the writer's
/// device memory ahead of its first step (default "1"; docs/worker-runtime.md#snapshot-files).
inline constexpr const char* kReserveAhead = "GPURUN_RESERVE_AHEAD";
// --- read by the supervisor's energy monitor (library overrides) ----------------------------
inline constexpr const char* kNvmlLibrary = "GPURUN_NVML_LIBRARY";  ///< path of libnvidia-ml
inline constexpr const char* kCudaLibrary = "GPURUN_CUDA_LIBRARY";  ///< path of libcuda
/// The power-limit journal's path (default /var/lib/gpurun as root, else ~/.local/state).
inline constexpr const char* kPowerJournal = "GPURUN_POWER_JOURNAL";
/// The simulated GPUs' state file that libgpurun_simulated_nvml.so reads (--simulate-gpus).
inline constexpr const char* kSimulatedGpusState = "GPURUN_FAKE_NVML_STATE";
// --- set by gpurun for every worker (added later) --------------------------------------------
/// Where the pause snapshot goes when GPURUN_SNAPSHOT_PATH (in /dev/shm) cannot hold it (full):
/// <run_dir>/state.snapshot. Set only when the primary path is not that file already.
inline constexpr const char* kSnapshotFallbackPath = "GPURUN_SNAPSHOT_FALLBACK_PATH";
/// Preemption (docs/cli.md#preemption): the directory of gpurun's requests to the worker
/// runtime (<run_dir>/preempt: `stop` = stop at the next boundary) and of its answers
/// (`runtime.<pgid>`: this process group's runtime handles them).
inline constexpr const char* kPreemptDir = "GPURUN_PREEMPT_DIR";
/// The preemption-warning signal's number (--preempt-signal; 0 = none): the runtime catches it
/// as a "checkpoint now" request.
inline constexpr const char* kPreemptSignal = "GPURUN_PREEMPT_SIGNAL";

}  // namespace gpurun::env
