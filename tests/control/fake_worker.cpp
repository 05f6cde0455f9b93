// A fake elastic worker for the control-protocol integration tests: speaks the
// protocol through WorkerControl, trains nothing. Behaviour is steered by files
// in the directory given as argv[1] (the test creates them):
//   stop            contains an epoch E: exit 0 on reaching epoch E (before reporting)
//   stop_gpu<N>     contains an epoch E: slot N alone exits 0 on reaching epoch E
//   die_gpu<N>      slot N exits 3 right after joining a generation > 0 (a dying joiner)
//   stall_gpu<N>    slot N never reports at its next boundary (sleeps)
//   stall_warm_gpu<N> a warm joiner of slot N never becomes ready (sleeps in its start-up)
//   exit_code_gpu<N> contains a code C: slot N exits C instead of 0 when told to exit
// Every decision read is appended to <dir>/reads.<gpu>.<pid>: "<store key> <json>".
// At start it writes <dir>/env.<gpu>.<pid> ("NAME=value" lines of the gpurun variables);
// after each boundary it appends the store's key count to <dir>/keys.<gpu>.<pid>.
// A decision of kind "exit" (the job is finishing) makes it exit 0.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "gpurun/control/worker_control.hpp"

namespace fs = std::filesystem;
using gpurun::control::Decision;
using gpurun::control::WorkerControl;
namespace keys = gpurun::control::keys;

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
  auto wc = WorkerControl::from_env();
  if (!wc) {
    std::fprintf(stderr, "fake_worker: GPURUN_ELASTIC is not set\n");
    return 2;
  }
  const int gpu = wc->gpu();
  const std::string me = std::to_string(gpu) + "." + std::to_string(::getpid());
  std::ofstream log(dir / ("reads." + me), std::ios::app);
  {
    std::ofstream env(dir / ("env." + me));
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GPURUN_SLOT",
                             "GPURUN_GPU_ID", "GPURUN_DEVICE", "GPURUN_JOIN_GENERATION",
                             "GPURUN_WARM", "GPURUN_ACTIVE_GPUS", "CUDA_VISIBLE_DEVICES"}) {
      const char* v = std::getenv(name);
      env << name << "=" << (v ? v : "<unset>") << "\n";
    }
  }
  std::ofstream key_counts(dir / ("keys." + me), std::ios::app);
  auto record = [&](const std::string& key) {
    log << key << " " << wc->current_json() << std::endl;
  };
  auto joined_as_joiner = [&](const Decision& d) {
    if (d.generation > 0 && fs::exists(dir / ("die_gpu" + std::to_string(gpu)))) {
      std::fprintf(stderr, "fake_worker gpu %d: dying as a joiner of generation %lld\n", gpu,
                   static_cast<long long>(d.generation));
      std::_Exit(3);
    }
  };

  Decision start;
  if (wc->warm()) {  // a warm joiner: ready at once, waits for its admission
    if (fs::exists(dir / ("stall_warm_gpu" + std::to_string(gpu)))) {
      std::fprintf(stderr, "fake_worker gpu %d: stalling in its warm start-up\n", gpu);
      while (true) ::pause();
    }
    std::optional<Decision> admitted = wc->wait_admission();
    if (!admitted) {
      std::printf("fake_worker gpu %d: told to exit before it was admitted\n", gpu);
      return 0;
    }
    start = *admitted;
  } else {
    start = wc->join();
  }
  record(keys::start(start.generation));
  joined_as_joiner(start);
  long epoch = start.epoch >= 0 ? start.epoch + 1 : 0;
  while (true) {
    std::this_thread::sleep_for(epoch_time);
    const long stop = stop_epoch(dir / "stop");
    const long my_stop = stop_epoch(dir / ("stop_gpu" + std::to_string(gpu)));
    if ((stop >= 0 && epoch >= stop) || (my_stop >= 0 && epoch >= my_stop)) {
      std::printf("fake_worker gpu %d: finished at epoch %ld\n", gpu, epoch);
      return 0;
    }
    if (fs::exists(dir / ("stall_gpu" + std::to_string(gpu)))) {
      std::fprintf(stderr, "fake_worker gpu %d: stalling before boundary %ld\n", gpu, epoch);
      while (true) ::pause();
    }
    const std::string key = keys::decision(wc->generation(), wc->round());
    Decision d = wc->report_and_wait(epoch, 0);
    record(key);
    // A pause: the state source "writes" the snapshot; everyone reports again at once.
    while (d.kind == Decision::Kind::kSnapshot) {
      const std::string again = keys::decision(wc->generation(), wc->round());
      d = wc->report_and_wait(epoch, 0, true, d.state_source.gpu == gpu ? "ok" : "");
      record(again);
    }
    key_counts << wc->client().num_keys() << std::endl;
    if (d.kind == Decision::Kind::kExit) {
      // exit_code_gpu<N>: what slot N's code after its loop ends with (a failed save).
      const long code = stop_epoch(dir / ("exit_code_gpu" + std::to_string(gpu)));
      std::printf("fake_worker gpu %d: told to exit at epoch %ld\n", gpu, epoch);
      return code > 0 ? static_cast<int>(code) : 0;
    }
    ++epoch;
    if (d.kind == Decision::Kind::kResize && d.is_leaver(gpu)) {
      if (d.park_mode == gpurun::control::ParkMode::kRelease) return 0;
      auto wake = wc->park_and_wait();
      if (!wake) return 0;
      record(keys::start(wake->generation));
      joined_as_joiner(*wake);
      epoch = wake->epoch + 1;
    }
  }
}
