/* gpurun_worker.h — the C interface of gpurun's worker protocol engine and its store I/O
 * (libgpurun_worker.so, built with the launcher; gpurun names it to every worker in
 * GPURUN_WORKER_LIBRARY). The Python package loads it with ctypes, so it stays pure Python and
 * cannot drift from the launcher's version. docs/control-protocol.md#worker-engine.
 *
 * Strings in and out are UTF-8 JSON (the engine's events and actions: gpurun/control/
 * worker_engine.hpp's to_json). Every returned char* is malloc'd: free it with gpurun_free().
 * On failure a function returns NULL (or a negative int) and gpurun_last_error() (this thread's)
 * says why; error kinds: 1 protocol (a bad value or key), 2 store (connection), 3 abandoned
 * (gpurun abandoned the generation's set-up), 4 invariant (an executor bug), 5 other, 6 state
 * (a snapshot refused: incomplete, corrupt, of another format; or none could be written).
 * Blocking: gpurun_worker_on may wait on the store without a deadline (gpurun's own deadlines
 * end a stuck job); no call is thread-safe on one handle. */
#ifndef GPURUN_WORKER_H
#define GPURUN_WORKER_H

#include <stddef.h>
#include <stdint.h>

#if defined(GPURUN_WORKER_BUILD)
#define GPURUN_API __attribute__((visibility("default")))
#else
#define GPURUN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define GPURUN_WORKER_ABI 7  /* 7: energy questions (gpurun_worker_energy_ask) */

typedef struct gpurun_worker gpurun_worker;
typedef struct gpurun_engine gpurun_engine;

/** GPURUN_WORKER_ABI of the library (a caller checks it equals its own). */
GPURUN_API int gpurun_worker_abi(void);
/** The last error of this thread: its message ("" when none) and kind (0 when none). */
GPURUN_API const char* gpurun_last_error(void);
GPURUN_API int gpurun_last_error_kind(void);
GPURUN_API void gpurun_free(void* p);
/** gpurun's words for a position training resumes at (control::position_text): (E, 0)
 * "after epoch E", (E, S) "in epoch E+1 after step S". */
GPURUN_API char* gpurun_position_text(int64_t epoch, int64_t step);
/** A standby, before it waits for its go: opens cuDNN's and cuBLAS's lazily opened libraries
 * beside the loaded ones (control::preload_libraries_beside; dlopen only, no CUDA call).
 * Blocks (tens of ms). Returns JSON {"loaded": n, "failed": ["path: why", ...], "seconds": s}. */
GPURUN_API char* gpurun_preload_cuda_libraries(void);

/** A session from the GPURUN_* environment, connected to gpurun's store. NULL with kind 0 when
 * the process is not elastic (no GPURUN_ELASTIC=1); NULL with an error otherwise. */
GPURUN_API gpurun_worker* gpurun_worker_open(void);
GPURUN_API void gpurun_worker_close(gpurun_worker* w);
/** Feeds one event (JSON object); returns the executor's actions as a JSON array. */
GPURUN_API char* gpurun_worker_on(gpurun_worker* w, const char* event_json);
/** {"slot","warm","generation","round","rank","world_size","state","finished","joining",
 * "current"} */
GPURUN_API char* gpurun_worker_info(gpurun_worker* w);
/** WorkerSession::wait_arrivals: 0, or -1 with the error (kind 3 when abandoned). */
GPURUN_API int gpurun_worker_wait_arrivals(gpurun_worker* w, const char* prefix, int rank, int size,
                                const char* abort_key, int64_t timeout_ms);
/** Slurm's SIGTERM (gpurun/worker/term_signal.hpp): under Slurm and gpurun, a SIGTERM not from
 * gpurun only counts, so the worker reaches gpurun's stop at its next boundary; gpurun's own
 * still ends the process. 1: installed; 0: not under Slurm and gpurun, or the program has its
 * own SIGTERM handler. Never blocks. */
GPURUN_API int gpurun_worker_install_term_handler(void);
/** This slot's small data in gpurun's store (e.g. RNG streams), per restart attempt. */
GPURUN_API int gpurun_worker_put_slot_data(gpurun_worker* w, const char* name, const void* data, size_t n);
/** The bytes (malloc'd, *n set), or NULL with *n = 0 when absent (kind 0) or on error. */
GPURUN_API void* gpurun_worker_get_slot_data(gpurun_worker* w, const char* name, size_t* n);

/** An energy question to node 0's gpurun (WorkerSession::energy_ask; docs/python.md#energy):
 * `question_json` is a control::EnergyQuestion ({"op","name","rank","t"}); returns gpurun's
 * answer (JSON, malloc'd; "" for "begin"), or NULL with the error (kind 1: a bad question,
 * kind 2: no answer within timeout_ms or the store is gone). Blocks up to timeout_ms. */
GPURUN_API char* gpurun_worker_energy_ask(gpurun_worker* w, const char* question_json,
                                          int64_t timeout_ms);

/** The step-progress line of this slot (GPURUN_PROGRESS_FILE, GPURUN_SLOT) that gpurun's
 * power-limit profiler reads (docs/energy.md#progress-file); NULL when not given. Never blocks. */
typedef struct gpurun_progress gpurun_progress;
GPURUN_API gpurun_progress* gpurun_progress_open(void);
GPURUN_API void gpurun_progress_step(gpurun_progress* p, uint64_t global_step);
GPURUN_API void gpurun_progress_close(gpurun_progress* p);

/** The pure engine, for table tests: options JSON {"slot","join_generation","warm","pid"}. */
GPURUN_API gpurun_engine* gpurun_engine_new(const char* options_json);
GPURUN_API void gpurun_engine_free(gpurun_engine* e);
/** Every action of one event (store actions included) as a JSON array. */
GPURUN_API char* gpurun_engine_on(gpurun_engine* e, const char* event_json);

/* ---- Snapshots: the pause snapshot's host side (gpurun/snapshot/snapshot_store.hpp, the code
 * the C++ runtime runs; layout: gpurun/snapshot/format.hpp; docs/worker-runtime.md#snapshot-files).
 * The caller copies the tensors; the library owns the paths, the file (created, reused,
 * page-locked, mapped), the crash-safe commit, the XXH64 payload hash (on up to 16 threads)
 * and the checks of a read. Stats JSON: {"path","tensor_bytes","file_bytes","created","mapped",
 * "pinned","locked","setup_s","pin_s","copy_s","checksum_s","total_s","failed_attempts"}
 * (seconds; bytes). A handle is used from one thread at a time, except that a prepare may run
 * on another thread: the others then wait for it. */
typedef struct gpurun_snapshots gpurun_snapshots;

/** How to page-lock a mapping for device copies: the process's own libcudart functions
 * cudaHostRegister, cudaHostUnregister and cudaGetLastError (called after a refused register).
 * Any NULL: no page-locking (copies still work, slower). Process-wide; call before any
 * snapshot call that pins. */
typedef int (*gpurun_host_register_fn)(void* p, size_t bytes, unsigned int flags);
typedef int (*gpurun_host_unregister_fn)(void* p);
typedef int (*gpurun_host_last_error_fn)(void);
GPURUN_API void gpurun_snapshot_set_pinner(gpurun_host_register_fn reg,
                                           gpurun_host_unregister_fn unreg,
                                           gpurun_host_last_error_fn last_error);

/** Each of n tensors' file offset (bytes) after a manifest of manifest_bytes bytes, into
 * offsets[n]; returns data_end (the end of the last tensor). The format's one layout rule. */
GPURUN_API uint64_t gpurun_snapshot_plan(uint64_t manifest_bytes, const uint64_t* sizes, size_t n,
                                         uint64_t* offsets);
/** The size of a new snapshot file for that snapshot (data_end + spare room, whole pages). */
GPURUN_API uint64_t gpurun_snapshot_file_bytes(uint64_t data_end, uint64_t manifest_bytes);

/** The run's snapshot paths: primary and fallback, each NULL for its GPURUN_SNAPSHOT_PATH /
 * GPURUN_SNAPSHOT_FALLBACK_PATH ("" for none). NULL with kind 0 when there is no path. */
GPURUN_API gpurun_snapshots* gpurun_snapshots_open(const char* primary, const char* fallback);
/** Unpins and unmaps the kept file (the file stays). */
GPURUN_API void gpurun_snapshots_close(gpurun_snapshots* s);
/** For a process about to exit: forgets the kept file without unpinning or unmapping it (the
 * process's end does both, with no other thread to interrupt). */
GPURUN_API void gpurun_snapshots_leave_to_exit(gpurun_snapshots* s);
/** The kept mapping's first byte (a file's offset 0), or NULL when none is mapped. */
GPURUN_API uint8_t* gpurun_snapshots_data(gpurun_snapshots* s);

/** Gets a file ready so that the first write only copies (blocks: posix_fallocate, mmap with
 * MAP_POPULATE, page-locking: seconds for GBs; run it on a background thread). Maps an existing
 * file that fits (never replacing one), else creates one. Returns stats JSON plus "done" (a
 * fitting file was kept already), "error" (why no file: "" when one is ready), "lock_error",
 * "existing_unfit"; NULL on a bad call. */
GPURUN_API char* gpurun_snapshots_prepare(gpurun_snapshots* s, uint64_t manifest_bytes,
                                          const uint64_t* sizes, size_t n, int on_device,
                                          int lock_host_memory);

/** A joiner of a paused job, while it starts: maps (and, on_device, page-locks) the committed
 * snapshot it will resume from, changing nothing in it, so that the resume's read only checks
 * and copies (ViT-H's 7.5 GB: ~0.5 s of mapping and cudaHostRegister otherwise inside the
 * resume). Blocks; run it on a thread. Returns stats JSON plus "done" and "error" ("no
 * committed snapshot at any path" when there is nothing to map). A standby calls it twice:
 * on_device = 0 while it waits (no CUDA), then 1 after its go, which only page-locks the kept
 * mapping when the file is still the one mapped (snapshot::finish_prepared_snapshot). */
GPURUN_API char* gpurun_snapshots_premap(gpurun_snapshots* s, int on_device);

/** Copies tensor i's sizes[i] bytes to base + offsets[i] (the padding is already zero);
 * returns 0 once every copy has landed (device copies synchronised), nonzero to fail. */
typedef int (*gpurun_snapshot_fill_fn)(void* ctx, uint8_t* base, const uint64_t* offsets,
                                       size_t n);
/** Writes a snapshot of a manifest (any bytes: the caller's) and n tensors of sizes[n] bytes
 * to the first path that can hold it, calling fill once per attempted path; crash-safe (a
 * file is void until committed), the other path's file removed. device_reserved_bytes: the
 * bytes the caller's CUDA caching allocator holds in its large pool (torch.cuda.memory_stats'
 * reserved_bytes.large_pool.current; 0: none or unknown), recorded in the header for the
 * reader (gpurun_snapshot_plan_reserve). Returns
 * stats JSON, or NULL (kind 6: "cannot write the state snapshot ...: every path failed: (1)
 * ..."; no file then remains). Blocks. */
GPURUN_API char* gpurun_snapshots_write(gpurun_snapshots* s, const char* manifest,
                                        size_t manifest_bytes, const uint64_t* sizes, size_t n,
                                        int on_device, uint64_t device_reserved_bytes,
                                        gpurun_snapshot_fill_fn fill, void* ctx);
/** Maps the snapshot to resume from (of two files, the newer), checks its header and, when
 * verify, its payload checksum over every byte (~0.1 s per GB per core, up to 16 cores);
 * page-locks it when on_device. Returns stats JSON plus "manifest" (the manifest bytes as a
 * string), "tensor_count", "data_offset", "data_end", "sequence", "writer_pid",
 * "device_reserved_bytes" (the writer's, 0: unknown); the bytes are
 * at gpurun_snapshots_data(). NULL (kind 6, naming the path and what is wrong) when refused. */
GPURUN_API char* gpurun_snapshots_read(gpurun_snapshots* s, int verify, int on_device);
/** How many bytes a resume reserves through its caching allocator ahead of its first step
 * (allocated on the training stream, freed at once), from the writer's
 * "device_reserved_bytes" (hint), what the allocator's large pool holds now (the state's
 * tensors allocated) and the device's free bytes:
 * snapshot::plan_device_reserve, with PYTORCH_ALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF and
 * PYTORCH_NO_CUDA_MEMORY_CACHING read from the environment. Returns JSON {"bytes": N,
 * "note": why less than missing, or ""}. (Every u64 of these JSON objects above 2^63 - 1 reads
 * as 2^63 - 1.) */
GPURUN_API char* gpurun_snapshot_plan_reserve(uint64_t hint, uint64_t reserved_now,
                                              uint64_t free_now);

#ifdef __cplusplus
}
#endif

#endif /* GPURUN_WORKER_H */
