// snapshot::write_snapshot / open_snapshot / make_prepared_snapshot without torch, in the call
// sequence of the runtimes (StateRegistry, the C API of libgpurun_worker.so): a caller's
// PayloadFill copies the tensors; a resume opens the file, checks the payload and reads the
// tensors at the header's offsets. These also run in the ASan/UBSan build.
#include "gpurun/snapshot/snapshot_store.hpp"

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "check_text.hpp"
#include "gpurun_process.hpp"
#include "snapshot_test_util.hpp"

namespace {

using gpurun::snapshot::OpenedSnapshot;
using gpurun::snapshot::PayloadFill;
using gpurun::snapshot::PayloadFrontier;
using gpurun::snapshot::SnapshotFile;
using gpurun::snapshot::SnapshotHeader;
using gpurun::snapshot::SnapshotLayout;
using gpurun::snapshot::SnapshotPaths;
using gpurun::snapshot::SnapshotStats;
using gpurun::testing::contains;
using gpurun::testing::what_of;
using gpurun::testing::snapshot::entries;
using gpurun::testing::snapshot::FakePinner;
using gpurun::testing::snapshot::pattern;
using gpurun::testing::snapshot::poke;

using Tensors = std::vector<std::vector<uint8_t>>;

Tensors state(uint8_t seed) {
  return {pattern(300'001, seed), pattern(64, seed + 1), pattern(0, seed + 2),
          pattern(70'000, seed + 3)};
}

SnapshotLayout layout_of(const Tensors& ts, const std::string& manifest, bool device = false) {
  std::vector<uint64_t> sizes;
  for (const auto& t : ts) sizes.push_back(t.size());
  return SnapshotLayout(manifest, sizes, device);
}

// The runtimes' fill: each tensor copied to its offset, the frontier advanced behind it.
PayloadFill fill_with(const Tensors& ts) {
  return [&ts](uint8_t* base, const SnapshotLayout& l, PayloadFrontier& written) {
    for (size_t i = 0; i < ts.size(); ++i) {
      if (!ts[i].empty())  // an empty vector's data() may be null: not for memcpy
        std::memcpy(base + l.offsets[i], ts[i].data(), ts[i].size());
      written.advance(l.offsets[i] + ts[i].size() - SnapshotHeader::kBytes);
    }
  };
}

// A resume in a fresh process: open, verify the payload, read the tensors back.
Tensors resume(const SnapshotPaths& paths, OpenedSnapshot* opened_out = nullptr) {
  std::optional<SnapshotFile> kept;
  SnapshotStats st;
  const OpenedSnapshot opened = gpurun::snapshot::open_snapshot(kept, paths, st);
  opened.header.check_payload(kept->data(), opened.path);
  // The tensors' sizes come from the caller's manifest; every test here has state()'s shapes.
  REQUIRE(opened.header.tensor_count == state(0).size());
  const SnapshotLayout expected = layout_of(state(0), opened.manifest);
  CHECK(opened.header.data_end == expected.header.data_end);
  Tensors out;
  for (size_t i = 0; i < expected.offsets.size(); ++i) {
    const uint8_t* at = kept->data() + expected.offsets[i];
    out.emplace_back(at, at + expected.tensor_bytes[i]);
  }
  if (opened_out != nullptr) *opened_out = opened;
  return out;
}

std::string written_at(std::optional<SnapshotFile>& kept, const SnapshotPaths& paths,
                       const Tensors& ts, const std::string& manifest, SnapshotStats& st) {
  const SnapshotLayout layout = layout_of(ts, manifest);
  return gpurun::snapshot::write_snapshot(kept, paths, layout, fill_with(ts), st);
}

}  // namespace

TEST_CASE("snapshot store: a written snapshot reads back byte-equal; the file is reused") {
  gpurun::testing::TempDir dir("gpurun-snap");
  const SnapshotPaths paths{dir.str() + "/state.snap", ""};
  std::optional<SnapshotFile> kept;
  SnapshotStats st;
  const Tensors first = state(1);
  CHECK(written_at(kept, paths, first, "{\"step\":1}", st) == paths.primary);
  CHECK(st.created);
  CHECK(st.path == paths.primary);
  CHECK(st.tensor_bytes == 370'065);
  CHECK(st.failed_attempts.empty());
  REQUIRE(kept.has_value());

  OpenedSnapshot opened;
  CHECK(resume(paths, &opened) == first);
  CHECK(opened.path == paths.primary);
  CHECK(opened.manifest == "{\"step\":1}");
  CHECK(opened.header.sequence == 1);
  CHECK(opened.header.tensor_count == 4);

  // The next pause of the same process writes into the kept mapping: no new file.
  const Tensors second = state(50);
  CHECK(written_at(kept, paths, second, "{\"step\":2}", st) == paths.primary);
  CHECK_FALSE(st.created);
  CHECK_FALSE(st.mapped);
  CHECK(resume(paths, &opened) == second);
  CHECK(opened.header.sequence == 2);

  // A fill that never advances the frontier (the C API's: libgpurun_worker.so's callback
  // copies everything, then returns): the payload is hashed once it returns.
  const Tensors third = state(90);
  const SnapshotLayout layout = layout_of(third, "{\"step\":3}");
  gpurun::snapshot::write_snapshot(
      kept, paths, layout,
      [&third](uint8_t* base, const SnapshotLayout& l, PayloadFrontier&) {
        for (size_t i = 0; i < third.size(); ++i)
          if (!third[i].empty()) std::memcpy(base + l.offsets[i], third[i].data(), third[i].size());
      },
      st);
  CHECK(resume(paths, &opened) == third);
  CHECK(opened.header.sequence == 3);
  CHECK(entries(dir.str()) == std::vector<std::string>{"state.snap"});  // no temporaries
}

TEST_CASE("snapshot store: a writer killed before its commit leaves no snapshot to resume from") {
  gpurun::testing::TempDir dir("gpurun-snap");
  const SnapshotPaths paths{dir.str() + "/state.snap", ""};
  {
    std::optional<SnapshotFile> kept;
    SnapshotStats st;
    written_at(kept, paths, state(1), "{\"step\":1}", st);
  }
  REQUIRE(resume(paths) == state(1));

  // A second writer process dies halfway through its tensor copies (SIGKILL, OOM, a node
  // failure): the file it leaves is refused, naming it, the writer and the snapshot; the
  // older snapshot was voided when this one began (the state was in memory then), so it is
  // never mixed with the new bytes.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::optional<SnapshotFile> kept;
    SnapshotStats st;
    const Tensors ts = state(7);
    const SnapshotLayout layout = layout_of(ts, "{\"step\":2}");
    gpurun::snapshot::write_snapshot(
        kept, paths, layout,
        [&](uint8_t* base, const SnapshotLayout& l, PayloadFrontier&) {
          std::memcpy(base + l.offsets[0], ts[0].data(), ts[0].size() / 2);
          ::_exit(0);
        },
        st);
    ::_exit(3);  // not reached
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  const std::string err = what_of([&] { resume(paths); });
  CHECK(contains(err, "'" + paths.primary + "' is incomplete"));
  CHECK(contains(err, "(pid " + std::to_string(child) + ")"));
  CHECK(contains(err, "snapshot #2"));

  // The next write (a fresh process) replaces it with a whole snapshot.
  std::optional<SnapshotFile> kept;
  SnapshotStats st;
  written_at(kept, paths, state(9), "{\"step\":3}", st);
  CHECK(resume(paths) == state(9));
}

TEST_CASE("snapshot store: a fill that fails leaves no file; the error of every path is named") {
  gpurun::testing::TempDir dir("gpurun-snap");
  const SnapshotPaths paths{dir.str() + "/shm.snap", dir.str() + "/run.snap"};
  std::optional<SnapshotFile> kept;
  SnapshotStats st;
  written_at(kept, paths, state(1), "{}", st);
  const Tensors ts = state(2);
  const SnapshotLayout layout = layout_of(ts, "{}");

  SUBCASE("a copy that fails (not an I/O error): no other path is tried") {
    CHECK_THROWS_WITH(gpurun::snapshot::write_snapshot(
                          kept, paths, layout,
                          [](uint8_t*, const SnapshotLayout&, PayloadFrontier&) {
                            throw std::runtime_error("copy failed");
                          },
                          st),
                      "copy failed");
  }
  SUBCASE("an I/O error at each path: both are listed") {
    const std::string err = what_of([&] {
      gpurun::snapshot::write_snapshot(
          kept, paths, layout,
          [](uint8_t*, const SnapshotLayout&, PayloadFrontier&) {
            throw gpurun::Error("device copy: I/O error");
          },
          st);
    });
    CHECK(contains(err, "every path failed: (1) '" + paths.primary + "': device copy"));
    CHECK(contains(err, "(2) '" + paths.fallback + "': device copy"));
  }
  CHECK_FALSE(kept.has_value());
  CHECK(entries(dir.str()).empty());
  CHECK(contains(what_of([&] { resume(paths); }), "no state snapshot to resume from at any path"));
}

TEST_CASE("snapshot store: a changed payload byte is refused, naming the file") {
  gpurun::testing::TempDir dir("gpurun-snap");
  const SnapshotPaths paths{dir.str() + "/state.snap", ""};
  std::optional<SnapshotFile> kept;
  SnapshotStats st;
  written_at(kept, paths, state(1), "{}", st);
  kept.reset();
  const SnapshotLayout layout = layout_of(state(1), "{}");
  poke(paths.primary, layout.offsets[3] + 12'345);  // one byte of the last tensor
  const std::string err = what_of([&] { resume(paths); });
  CHECK(contains(err, "state snapshot '" + paths.primary + "': payload checksum"));
  CHECK(contains(err, "file corrupt"));
  CHECK(contains(err, "cannot be resumed from"));
}

TEST_CASE("snapshot store: a primary path that cannot hold it falls back; the newer file is read") {
  gpurun::testing::TempDir dir("gpurun-snap");
  const SnapshotPaths paths{dir.str() + "/missing-dir/state.snap", dir.str() + "/run.snap"};
  std::optional<SnapshotFile> kept;
  SnapshotStats st;
  CHECK(written_at(kept, paths, state(1), "{}", st) == paths.fallback);
  REQUIRE(st.failed_attempts.size() == 1);
  CHECK(contains(st.failed_attempts[0], "'" + paths.primary + "'"));
  CHECK(contains(st.failed_attempts[0], "No such file or directory"));
  CHECK(resume(paths) == state(1));

  // Two files (a crash between writing one and removing the other): the newer one is read.
  const std::string a = dir.str() + "/a.snap", b = dir.str() + "/b.snap";
  kept.reset();
  written_at(kept, SnapshotPaths{a, ""}, state(2), "{}", st);
  REQUIRE(::link(a.c_str(), b.c_str()) == 0);  // b: the older snapshot, from now on
  kept.reset();
  REQUIRE(::unlink(a.c_str()) == 0);
  written_at(kept, SnapshotPaths{a, ""}, state(3), "{}", st);
  OpenedSnapshot opened;
  CHECK(resume(SnapshotPaths{b, a}, &opened) == state(3));
  CHECK(opened.path == a);
  // An invalid one among them fails the read rather than guess.
  poke(b, 0);
  const std::string err = what_of([&] { resume(SnapshotPaths{b, a}); });
  CHECK(contains(err, "state snapshot files at 2 paths"));
  CHECK(contains(err, "'" + b + "' is not a gpurun state snapshot"));
}

TEST_CASE("snapshot store: a prepared file is page-locked ahead and used by the first pause") {
  gpurun::testing::TempDir dir("gpurun-snap");
  const SnapshotPaths paths{dir.str() + "/state.snap", ""};
  FakePinner pinner;
  const Tensors ts = state(4);
  const SnapshotLayout layout = layout_of(ts, "{}", /*device=*/true);
  gpurun::snapshot::SnapshotPreparation plan;
  plan.paths = paths.list();
  plan.data_end = layout.header.data_end;
  plan.manifest_bytes = layout.manifest.size();
  plan.file_bytes = gpurun::snapshot::snapshot_file_bytes(plan.data_end, plan.manifest_bytes);
  plan.on_device = true;

  gpurun::snapshot::PreparedSnapshot p = gpurun::snapshot::make_prepared_snapshot(plan);
  REQUIRE(p.file != nullptr);
  CHECK(p.error.empty());
  CHECK(p.stats.created);
  CHECK(p.stats.pinned);
  CHECK(p.file->size() == plan.file_bytes);
  REQUIRE(pinner.calls->size() == 1);
  CHECK(pinner.calls->at(0).data == p.file->data());
  CHECK(pinner.calls->at(0).bytes == plan.file_bytes);
  // Prepared, no snapshot yet: a resume is refused.
  CHECK(contains(what_of([&] { resume(paths); }), "holds no snapshot yet"));

  // The first pause only copies: the prepared, pinned mapping is written in place.
  std::optional<SnapshotFile> kept;
  kept.emplace(std::move(*p.file));
  p.file.reset();
  CHECK(gpurun::snapshot::kept_fits(*kept, plan.paths, plan.data_end, plan.manifest_bytes));
  SnapshotStats st;
  gpurun::snapshot::write_snapshot(kept, paths, layout, fill_with(ts), st);
  CHECK_FALSE(st.created);
  CHECK_FALSE(st.mapped);
  CHECK(st.pinned);
  CHECK(pinner.calls->size() == 1);  // pinned once, ahead
  CHECK(resume(paths) == ts);

  // Preparing again (a new process) maps the snapshot there and never changes it.
  kept.reset();
  gpurun::snapshot::PreparedSnapshot again = gpurun::snapshot::make_prepared_snapshot(plan);
  REQUIRE(again.file != nullptr);
  CHECK(again.stats.mapped);
  CHECK_FALSE(again.stats.created);
  CHECK(resume(paths) == ts);

  // A state that no longer fits the file there: no file, the existing one left alone.
  again.file.reset();
  gpurun::snapshot::SnapshotPreparation big = plan;
  big.data_end = plan.data_end * 4;
  big.file_bytes = gpurun::snapshot::snapshot_file_bytes(big.data_end, big.manifest_bytes);
  const gpurun::snapshot::PreparedSnapshot unfit = gpurun::snapshot::make_prepared_snapshot(big);
  CHECK(unfit.file == nullptr);
  CHECK(unfit.existing_unfit);
  CHECK(contains(unfit.error, "'" + paths.primary + "' exists and does not fit"));
  CHECK(resume(paths) == ts);
}

TEST_CASE("snapshot store: a FIFO at the other path never blocks a pause (it is removed)") {
  gpurun::testing::TempDir dir("gpurun-snap");
  const SnapshotPaths paths{dir.str() + "/state.snap", dir.str() + "/other.snap"};
  REQUIRE(::mkfifo(paths.fallback.c_str(), 0600) == 0);
  // In a child with an alarm: before the fix, voiding the other path opened the FIFO for
  // writing and waited for a reader forever.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::alarm(5);
    std::optional<SnapshotFile> kept;
    SnapshotStats st;
    const std::string at = written_at(kept, paths, state(7), "{}", st);
    ::_exit(at == paths.primary ? 0 : 3);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK_FALSE(WIFSIGNALED(status));  // SIGALRM: the pause hung on the FIFO
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(resume(paths) == state(7));
  CHECK(entries(dir.str()) == std::vector<std::string>{"state.snap"});
}
