// The C interface of the worker engine (gpurun_worker.h): thin wrappers that catch every
// exception at the boundary and keep its message for gpurun_last_error().
#include "gpurun_worker.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "capi_util.hpp"
#include "gpurun/control/decision.hpp"
#include "gpurun/control/progress.hpp"
#include "gpurun/json_writer.hpp"
#include "gpurun/worker/library_preload.hpp"
#include "gpurun/worker/term_signal.hpp"
#include "gpurun/worker/worker_session.hpp"

using gpurun::control::EngineEvent;
using gpurun::control::WorkerEngine;
using gpurun::control::WorkerSession;

struct gpurun_worker {
  std::unique_ptr<WorkerSession> session;
};
struct gpurun_progress {
  std::unique_ptr<gpurun::control::ProgressWriter> writer;
};
struct gpurun_engine {
  std::unique_ptr<WorkerEngine> engine;
};

using gpurun::capi::dup;
using gpurun::capi::guarded;

extern "C" {

int gpurun_worker_abi(void) {
  return GPURUN_WORKER_ABI;
}
const char* gpurun_last_error(void) {
  return gpurun::capi::last_error().c_str();
}
int gpurun_last_error_kind(void) {
  return gpurun::capi::last_error_kind();
}
void gpurun_free(void* p) {
  std::free(p);
}
char* gpurun_position_text(int64_t epoch, int64_t step) {
  return guarded([&] { return dup(gpurun::control::position_text(epoch, step)); },
                 static_cast<char*>(nullptr));
}

char* gpurun_preload_cuda_libraries(void) {
  return guarded(
      [] {
        const auto r =
            gpurun::control::preload_libraries_beside(gpurun::control::cuda_library_families());
        gpurun::JsonObject o;
        o.add("loaded", r.loaded).add("failed", r.failed).add("seconds", r.seconds);
        return dup(o.str());
      },
      static_cast<char*>(nullptr));
}

gpurun_worker* gpurun_worker_open(void) {
  return guarded(
      []() -> gpurun_worker* {
        auto s = WorkerSession::from_env();
        if (!s) return nullptr;
        return new gpurun_worker{std::move(s)};
      },
      static_cast<gpurun_worker*>(nullptr));
}

void gpurun_worker_close(gpurun_worker* w) {
  delete w;
}

char* gpurun_worker_on(gpurun_worker* w, const char* event_json) {
  return guarded(
      [&] {
        return dup(
            gpurun::control::to_json(w->session->on(gpurun::control::event_from_json(event_json))));
      },
      static_cast<char*>(nullptr));
}

int gpurun_worker_install_term_handler(void) {
  return gpurun::control::install_external_term_handler() ? 1 : 0;
}

char* gpurun_worker_info(gpurun_worker* w) {
  return guarded(
      [&] {
        const WorkerEngine& e = w->session->engine();
        gpurun::JsonObject o;
        o.add("slot", e.slot())
            .add("warm", e.warm())
            .add("standby", e.standby())
            .add("generation", e.generation())
            .add("round", e.round())
            .add("rank", e.rank())
            .add("world_size", e.world_size())
            .add("state", gpurun::to_string(e.state()))
            .add("finished", e.finished())
            .add("joining", e.joining());
        if (e.has_generation())
          o.add_raw("current", e.current().to_json());
        else
          o.add_null("current");
        return dup(o.str());
      },
      static_cast<char*>(nullptr));
}

int gpurun_worker_wait_arrivals(gpurun_worker* w, const char* prefix, int rank, int size,
                                const char* abort_key, int64_t timeout_ms) {
  return guarded(
      [&] {
        w->session->wait_arrivals(prefix, rank, size, abort_key ? abort_key : "",
                                  std::chrono::milliseconds(timeout_ms));
        return 0;
      },
      -1);
}

int gpurun_worker_put_slot_data(gpurun_worker* w, const char* name, const void* data, size_t n) {
  return guarded(
      [&] {
        w->session->put_slot_data(name, std::string(static_cast<const char*>(data), n));
        return 0;
      },
      -1);
}

void* gpurun_worker_get_slot_data(gpurun_worker* w, const char* name, size_t* n) {
  *n = 0;
  return guarded(
      [&]() -> void* {
        std::optional<std::string> v = w->session->get_slot_data(name);
        if (!v) return nullptr;
        void* p = std::malloc(v->size() ? v->size() : 1);
        if (p && !v->empty()) std::memcpy(p, v->data(), v->size());
        *n = v->size();
        return p;
      },
      static_cast<void*>(nullptr));
}

char* gpurun_worker_energy_ask(gpurun_worker* w, const char* question_json, int64_t timeout_ms) {
  return guarded(
      [&] {
        return dup(w->session->energy_ask(gpurun::control::EnergyQuestion::from_json(question_json),
                                          std::chrono::milliseconds(timeout_ms)));
      },
      static_cast<char*>(nullptr));
}

gpurun_progress* gpurun_progress_open(void) {
  return guarded(
      []() -> gpurun_progress* {
        auto w = gpurun::control::ProgressWriter::from_env();
        if (!w) return nullptr;
        return new gpurun_progress{std::move(w)};
      },
      static_cast<gpurun_progress*>(nullptr));
}

void gpurun_progress_step(gpurun_progress* p, uint64_t global_step) {
  if (p) p->writer->step(global_step);
}

void gpurun_progress_close(gpurun_progress* p) {
  delete p;
}

gpurun_engine* gpurun_engine_new(const char* options_json) {
  return guarded(
      [&] {
        return new gpurun_engine{
            std::make_unique<WorkerEngine>(gpurun::control::options_from_json(options_json))};
      },
      static_cast<gpurun_engine*>(nullptr));
}

void gpurun_engine_free(gpurun_engine* e) {
  delete e;
}

char* gpurun_engine_on(gpurun_engine* e, const char* event_json) {
  return guarded(
      [&] {
        return dup(
            gpurun::control::to_json(e->engine->on(gpurun::control::event_from_json(event_json))));
      },
      static_cast<char*>(nullptr));
}

}  // extern "C"
