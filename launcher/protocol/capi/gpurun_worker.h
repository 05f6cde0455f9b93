/* gpurun_worker.h — the C interface of gpurun's worker protocol engine and its store I/O
 * (libgpurun_worker.so, built with the launcher; gpurun names it to every worker in
 * GPURUN_WORKER_LIBRARY). The Python package loads it with ctypes, so it stays pure Python and
 * cannot drift from the launcher's version. docs/control-protocol.md#worker-engine.
 *
 * Strings in and out are UTF-8 JSON (the engine's events and actions: gpurun/control/
 * worker_engine.hpp's to_json). Every returned char* is malloc'd: free it with gpurun_free().
 * On failure a function returns NULL (or a negative int) and gpurun_last_error() (this thread's)
 * says why; error kinds: 1 protocol (a bad value or key), 2 store (connection), 3 abandoned
 * (gpurun abandoned the generation's set-up), 4 invariant (an executor bug), 5 other.
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

#define GPURUN_WORKER_ABI 1

typedef struct gpurun_worker gpurun_worker;
typedef struct gpurun_engine gpurun_engine;

/** GPURUN_WORKER_ABI of the library (a caller checks it equals its own). */
GPURUN_API int gpurun_worker_abi(void);
/** The last error of this thread: its message ("" when none) and kind (0 when none). */
GPURUN_API const char* gpurun_last_error(void);
GPURUN_API int gpurun_last_error_kind(void);
GPURUN_API void gpurun_free(void* p);

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
/** This slot's small data in gpurun's store (e.g. RNG streams), per restart attempt. */
GPURUN_API int gpurun_worker_put_slot_data(gpurun_worker* w, const char* name, const void* data, size_t n);
/** The bytes (malloc'd, *n set), or NULL with *n = 0 when absent (kind 0) or on error. */
GPURUN_API void* gpurun_worker_get_slot_data(gpurun_worker* w, const char* name, size_t* n);

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

#ifdef __cplusplus
}
#endif

#endif /* GPURUN_WORKER_H */
