// --requeue's `scontrol requeue` (launcher/supervisor/preemption.hpp): what the program that
// gpurun runs sees. The whole path through the binary: integration_test.cpp ("gpurun
// preemption: ...").
#include "supervisor/preemption.hpp"

#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "gpurun_process.hpp"

using gpurun::testing::slurp;
using gpurun::testing::TempDir;
using namespace std::chrono_literals;

TEST_CASE("requeue_job: scontrol starts with no signal blocked or ignored, whatever gpurun's") {
  // gpurun ignores SIGPIPE (main.cpp) and blocks signals in its threads: neither reaches
  // scontrol, nor a script standing in for it.
  TempDir dir;
  const std::filesystem::path scontrol = dir.path / "scontrol";
  std::ofstream(scontrol) << "#!/bin/sh\ngrep -E '^Sig(Blk|Ign):' /proc/self/status > "
                          << (dir.path / "signals").string() << "\necho \"$@\" > "
                          << (dir.path / "args").string() << "\n";
  std::filesystem::permissions(scontrol, std::filesystem::perms::owner_all);
  struct sigaction old_pipe {};
  ::sigaction(SIGPIPE, nullptr, &old_pipe);
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t block, old_mask;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR1);
  sigaddset(&block, SIGTERM);
  ::pthread_sigmask(SIG_BLOCK, &block, &old_mask);
  const gpurun::supervisor::RequeueResult r =
      gpurun::supervisor::requeue_job({{"SLURM_JOB_ID", "4242"}, {"PATH", dir.path.string()}}, 30s);
  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  ::sigaction(SIGPIPE, &old_pipe, nullptr);
  CHECK(r.requeued);
  CHECK(r.message ==
        "--requeue: job 4242 requeued (`" + scontrol.string() + " requeue 4242`); exit status 75");
  CHECK(slurp(dir.path / "args") == "requeue 4242\n");
  const std::string text = slurp(dir.path / "signals");
  INFO("the /proc status of a program scontrol runs: ", text);
  // Without glibc's internal signals 32 and 33 (posix_spawn's child ignores them).
  constexpr unsigned long long kGlibcInternal = (1ULL << 31) | (1ULL << 32);
  for (const char* field : {"SigBlk:", "SigIgn:"}) {
    const auto at = text.find(field);
    REQUIRE(at != std::string::npos);
    CHECK((std::stoull(text.substr(at + 7), nullptr, 16) & ~kGlibcInternal) == 0);
  }
}
