#include "gpurun/worker/term_signal.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include "gpurun/env_names.hpp"

namespace gpurun::control {

namespace {

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

}  // namespace

bool install_external_term_handler() {
  const char* dir = std::getenv(env::kPreemptDir);
  if (dir == nullptr || *dir == '\0' || std::getenv("SLURM_JOB_ID") == nullptr) return false;
  struct sigaction cur {};
  if (::sigaction(SIGTERM, nullptr, &cur) != 0) return false;
  if ((cur.sa_flags & SA_SIGINFO) != 0 && cur.sa_sigaction == on_term_signal) return true;
  if (cur.sa_handler != SIG_DFL) return false;  // the program's own
  struct sigaction sa {};
  sa.sa_sigaction = on_term_signal;
  sa.sa_flags = SA_RESTART | SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  return ::sigaction(SIGTERM, &sa, nullptr) == 0;
}

bool external_term_seen() {
  return g_external_term.load(std::memory_order_relaxed) != 0;
}

}  // namespace gpurun::control
