// progress_bench — what the workers' step-progress signal (control::ProgressWriter, read by the
// supervisor's power-limit profiler; docs/energy.md#progress-file) costs per optimizer step,
// measured while a reader thread polls the same line at 10 kHz (the monitor polls at 10 Hz).
//
//   progress_bench [--steps N] [--step-ms MS]
//
// Prints ns per step() and that cost as a share of an MS-millisecond optimizer step (default
// 1 ms, shorter than any real GPU training step), against the goal of 0.5 %.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "gpurun/control/progress.hpp"

int main(int argc, char** argv) {
  long long steps = 20'000'000;
  double step_ms = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--steps")
      steps = std::atoll(argv[i + 1]);
    else if (k == "--step-ms")
      step_ms = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: progress_bench [--steps N] [--step-ms MS]\n");
      return 2;
    }
  }
  const std::string path = "/tmp/gpurun-progress-bench-" + std::to_string(::getpid());
  gpurun::control::ProgressFile file(path, 8);
  gpurun::control::ProgressWriter writer(path, 3);
  std::atomic<bool> stop{false};
  uint64_t seen = 0;
  std::thread reader([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      seen = file.read(3).steps;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  for (long long s = 1; s <= steps; ++s) writer.step(static_cast<uint64_t>(s));
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
      static_cast<double>(steps);
  stop = true;
  reader.join();
  const bool ok = file.read(3).steps == static_cast<uint64_t>(steps);
  const double share = ns / (step_ms * 1e6) * 100.0;
  std::printf(
      "| progress signal | %.1f ns per step | %.6f %% of a %.1f ms step | goal <= 0.5 %% %s |\n",
      ns, share, step_ms, share <= 0.5 && ok ? "met" : "MISSED");
  (void)seen;
  return ok ? 0 : 1;
}
