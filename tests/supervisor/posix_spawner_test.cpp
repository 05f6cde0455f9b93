// PosixSpawner (launcher/supervisor/posix_spawner.hpp) on real processes: what a worker gets
// (its output, its exit status, no descriptor of gpurun's) and what a worker that cannot be
// executed is told. The clone path of every build, and the fork path of the ThreadSanitizer
// build (scripts/tsan.sh), which reports a failed exec through a pipe.
#include "supervisor/posix_spawner.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <string>

#include <boost/asio/io_context.hpp>

#include "check_text.hpp"
#include "gpurun/unique_fd.hpp"
#include "gpurun_process.hpp"

namespace sv = gpurun::supervisor;
using gpurun::testing::TempDir;
using namespace std::chrono_literals;

namespace {

/// A worker's stdout and exit status, once it exited and closed its streams (within 20 s).
struct Ran {
  std::string out;
  std::optional<sv::ExitStatus> exit;
};

Ran run_worker(sv::PosixSpawner& spawner, boost::asio::io_context& io,
               std::vector<std::string> argv) {
  Ran ran;
  int closed = 0;
  sv::SpawnRequest req;
  req.rank = 0;
  req.argv = std::move(argv);
  sv::WorkerCallbacks cb;
  cb.on_output = [&](sv::StreamId id, std::string_view bytes) {
    if (id == sv::StreamId::kStdout) ran.out += bytes;
  };
  cb.on_stream_closed = [&](sv::StreamId) { ++closed; };
  cb.on_exit = [&](sv::ExitStatus s) { ran.exit = s; };
  auto worker = spawner.spawn(req, std::move(cb));
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  io.restart();
  while ((!ran.exit || closed < 2) && std::chrono::steady_clock::now() < deadline) io.run_for(50ms);
  return ran;
}

}  // namespace

TEST_CASE("posix spawner: a worker runs with its output read, its exit status and no other fd") {
  boost::asio::io_context io;
  sv::PosixSpawner spawner(io);
  // A descriptor gpurun did not mark close-on-exec stays out of the worker all the same.
  const gpurun::UniqueFd leaked(::fcntl(STDERR_FILENO, F_DUPFD, 100));
  REQUIRE(leaked.get() >= 100);
  const std::string fd = std::to_string(leaked.get());
  const Ran ran = run_worker(spawner, io,
                             {"/bin/sh", "-c",
                              "if [ -e /proc/$$/fd/" + fd + " ]; then echo fd " + fd +
                                  " inherited; else echo clean; fi; exit 7"});
  REQUIRE(ran.exit.has_value());
  CHECK(ran.exit->code == 7);
  CHECK(ran.exit->signal == 0);
  CHECK(ran.out == "clean\n");
}

TEST_CASE("posix spawner: a worker that cannot be executed is refused with exec's reason") {
  boost::asio::io_context io;
  sv::PosixSpawner spawner(io);
  TempDir dir("gpurun-spawn");
  const std::string bad = (dir.path / "not_a_program").string();
  std::ofstream(bad) << "\x7f"
                        "ELF not a program";
  REQUIRE(::chmod(bad.c_str(), 0755) == 0);
  sv::SpawnRequest req;
  req.rank = 3;
  req.argv = {bad};
  CHECK(gpurun::testing::what_of([&] { spawner.spawn(req, {}); }) ==
        "cannot start rank 3 ('" + bad + "'): Exec format error");
  // The spawner is still whole: the next worker starts.
  const Ran ran = run_worker(spawner, io, {"/bin/sh", "-c", "echo next"});
  REQUIRE(ran.exit.has_value());
  CHECK(ran.exit->code == 0);
  CHECK(ran.out == "next\n");
}
