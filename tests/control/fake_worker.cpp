// A fake elastic worker for the control-protocol integration tests: speaks the
// protocol through the worker engine (WorkerSession), as the real runtimes do, and executes
// its actions as no-ops: trains nothing. Behaviour is steered by files
// in the directory given as argv[1] (the test creates them):
//   stop            contains an epoch E: exit 0 on reaching epoch E (before reporting)
//   stop_gpu<N>     contains an epoch E: slot N alone exits 0 on reaching epoch E
//   die_gpu<N>      slot N exits 3 right after joining a generation > 0 (a dying joiner)
//   stall_gpu<N>    slot N never reports at its next boundary (stops itself: SIGSTOP)
//   stall_warm_gpu<N> a warm joiner of slot N never becomes ready (sleeps in its start-up)
//   hold_warm_gpu<N> (a FIFO) a warm joiner of slot N gets ready once it reads a line from it
//   stall_setup_gpu<N> slot N, in a generation > 0, stops itself (SIGSTOP) in its make_group
//   exit_code_gpu<N> contains a code C: slot N exits C instead of 0 when told to exit
//   startup_ms      contains M: after joining, sleep M ms before the first epoch (a start-up)
//   steps           contains S: each epoch is S steps, each published in the progress file
//                   (GPURUN_PROGRESS_FILE) as the worker runtime does
// Every decision read is appended to <dir>/reads.<gpu>.<pid>: "<store key> <json>".
// At start it writes <dir>/env.<gpu>.<pid> ("NAME=value" lines of the gpurun variables);
// after each boundary it appends the store's key count to <dir>/keys.<gpu>.<pid>.
// A decision of kind "exit" (the job is finishing) makes it exit 0.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "gpurun/control/progress.hpp"
#include "gpurun/worker/worker_session.hpp"

namespace fs = std::filesystem;
using gpurun::control::Decision;
using gpurun::control::EngineAction;
using gpurun::control::EngineEvent;
using gpurun::control::WorkerSession;

namespace {

long stop_epoch(const fs::path& file) {
  std::ifstream in(file);
  long e = -1;
  if (in >> e) return e;
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: fake_worker DIR EPOCH_MS\n");
    return 2;
  }
  const fs::path dir = argv[1];
  const auto epoch_time = std::chrono::milliseconds(std::stol(argv[2]));
  const char* slot_env = std::getenv("GPURUN_SLOT");
  const int gpu = slot_env ? std::atoi(slot_env) : -1;
  const std::string me = std::to_string(gpu) + "." + std::to_string(::getpid());
  std::ofstream log(dir / ("reads." + me), std::ios::app);
  gpurun::control::SessionOptions so;
  so.on_value = [&](const std::string& key, const std::string& value) {
    // The decisions read: start records, round decisions, wakes, admissions.
    std::string k = key;
    if (k.find("/wake/") != std::string::npos || k.find("/admit/") != std::string::npos) {
      const Decision d = Decision::from_json(value);
      if (d.kind != Decision::Kind::kExit) k = gpurun::control::keys::start(d.generation);
    }
    log << k << " " << value << std::endl;
  };
  auto session = WorkerSession::from_env(std::move(so));
  if (!session) {
    std::fprintf(stderr, "fake_worker: GPURUN_ELASTIC is not set\n");
    return 2;
  }
  {
    std::ofstream env(dir / ("env." + me));
    for (const char* name :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GPURUN_SLOT", "GPURUN_GPU_ID",
          "GPURUN_DEVICE", "GPURUN_JOIN_GENERATION", "GPURUN_WARM", "GPURUN_ACTIVE_GPUS",
          "CUDA_VISIBLE_DEVICES", "GROUP_RANK", "GPURUN_CONFIG"}) {
      const char* v = std::getenv(name);
      env << name << "=" << (v ? v : "<unset>") << "\n";
    }
  }
  std::ofstream key_counts(dir / ("keys." + me), std::ios::app);
  gpurun::store::Client counter(WorkerSession::store_options_from_env());
  auto die_as_joiner = [&](int64_t generation) {
    if (generation > 0 && fs::exists(dir / ("die_gpu" + std::to_string(gpu)))) {
      std::fprintf(stderr, "fake_worker gpu %d: dying as a joiner of generation %lld\n", gpu,
                   static_cast<long long>(generation));
      std::_Exit(3);
    }
  };

  long epoch = 0;
  // Runs the engine's actions as no-ops until it waits for the program; returns the last.
  auto drive = [&](EngineEvent e) {
    EngineAction last;
    while (true) {
      std::optional<EngineEvent> next;
      for (EngineAction& a : session->on(e)) {
        if (a.kind == EngineAction::Kind::kState &&
            a.to == gpurun::WorkerState::kRejoining) {  // woken in hold mode: a joiner again
          epoch = session->engine().current().epoch + 1;
        }
        // A joiner (spawned, warm or woken) that joined a generation > 0 dies before its
        // set-up when told to.
        if (a.kind == EngineAction::Kind::kMakeGroup &&
            session->engine().state() == gpurun::WorkerState::kRejoining)
          die_as_joiner(session->engine().generation());
        if (a.kind == EngineAction::Kind::kMakeGroup && session->engine().generation() > 0 &&
            fs::exists(dir / ("stall_setup_gpu" + std::to_string(gpu)))) {
          std::fprintf(stderr, "fake_worker gpu %d: stalling in the set-up of generation %lld\n",
                       gpu, static_cast<long long>(session->engine().generation()));
          ::raise(SIGSTOP);  // as a user's SIGSTOP would: gpurun's SIGKILL ends it
          while (true) ::pause();
        }
        if (a.needs_outcome()) {
          EngineEvent done;
          done.kind = EngineEvent::Kind::kDone;
          if (a.kind == EngineAction::Kind::kWriteSnapshot) done.text = "ok";
          next = done;
        }
        last = std::move(a);
      }
      if (!next) return last;
      e = *next;
    }
  };

  EngineEvent open;
  open.kind = EngineEvent::Kind::kOpen;
  drive(open);
  if (session->engine().has_generation()) {
    const Decision& start = session->engine().current();
    epoch = start.epoch >= 0 ? start.epoch + 1 : 0;
  }
  if (session->engine().warm() && fs::exists(dir / ("stall_warm_gpu" + std::to_string(gpu)))) {
    std::fprintf(stderr, "fake_worker gpu %d: stalling in its warm start-up\n", gpu);
    while (true) ::pause();
  }
  if (const fs::path hold = dir / ("hold_warm_gpu" + std::to_string(gpu));
      session->engine().warm() && fs::exists(hold)) {
    const int fd = ::open(hold.c_str(), O_RDONLY | O_CLOEXEC);  // the test holds a writer
    for (char c = 0; fd >= 0;) {
      const ssize_t n = ::read(fd, &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n != 1 || c == '\n') break;
    }
    if (fd >= 0) ::close(fd);
  }
  // Its device is needed now (a standby waits here for its go key, or is told to exit).
  EngineEvent device;
  device.kind = EngineEvent::Kind::kDevice;
  if (drive(device).kind == EngineAction::Kind::kExit) {
    std::printf("fake_worker gpu %d: a standby told to exit\n", gpu);
    return 0;
  }
  EngineEvent ready;
  ready.kind = EngineEvent::Kind::kReady;
  EngineAction last = drive(ready);
  if (last.kind == EngineAction::Kind::kExit) {
    std::printf("fake_worker gpu %d: told to exit before it was admitted\n", gpu);
    return 0;
  }
  if (session->engine().warm()) epoch = session->engine().current().epoch + 1;
  if (const long ms = stop_epoch(dir / "startup_ms"); ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  const long steps = stop_epoch(dir / "steps");
  std::unique_ptr<gpurun::control::ProgressWriter> progress =
      steps > 0 ? gpurun::control::ProgressWriter::from_env() : nullptr;
  uint64_t global_step = 0;
  while (true) {
    if (progress) {
      for (long s = 0; s < steps; ++s) {
        std::this_thread::sleep_for(epoch_time / steps);
        progress->step(++global_step);
      }
    } else {
      std::this_thread::sleep_for(epoch_time);
    }
    const long stop = stop_epoch(dir / "stop");
    const long my_stop = stop_epoch(dir / ("stop_gpu" + std::to_string(gpu)));
    if ((stop >= 0 && epoch >= stop) || (my_stop >= 0 && epoch >= my_stop)) {
      std::printf("fake_worker gpu %d: finished at epoch %ld\n", gpu, epoch);
      return 0;
    }
    if (fs::exists(dir / ("stall_gpu" + std::to_string(gpu)))) {
      // Stopped, as a user's SIGSTOP or a debugger would: a rank that merely runs (sleeps in
      // the program's own code) is waited for at a boundary, a stopped one is killed.
      std::fprintf(stderr, "fake_worker gpu %d: stalling before boundary %ld\n", gpu, epoch);
      while (true) ::raise(SIGSTOP);
    }
    EngineEvent b;
    b.kind = EngineEvent::Kind::kBoundary;
    b.epoch = epoch;
    b.step = 0;
    const long reported = epoch;
    ++epoch;
    last = drive(b);
    key_counts << counter.num_keys() << std::endl;
    if (last.kind == EngineAction::Kind::kExit) {
      if (last.left) return 0;  // a leaver (release mode), or told to exit while parked
      // exit_code_gpu<N>: what slot N's code after its loop ends with (a failed save).
      const long code = stop_epoch(dir / ("exit_code_gpu" + std::to_string(gpu)));
      std::printf("fake_worker gpu %d: told to exit at epoch %ld\n", gpu, reported);
      return code > 0 ? static_cast<int>(code) : 0;
    }
  }
}
