// snapshot::SnapshotHeader, MappedFile and SnapshotFile without torch: the file layout, the
// begin/commit protocol on a real mapped file, the checks a reader makes and the page-locking
// through an installed HostPinner. (The LibTorch suites test the same through StateRegistry;
// these also run in the ASan/UBSan build.)
#include "gpurun/snapshot/snapshot_file.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "check_text.hpp"
#include "gpurun/snapshot/format.hpp"
#include "gpurun/snapshot/mapped_file.hpp"
#include "gpurun_process.hpp"
#include "snapshot_test_util.hpp"

namespace {

using gpurun::StateError;
using gpurun::snapshot::MappedFile;
using gpurun::snapshot::payload_digest;
using gpurun::snapshot::SnapshotFile;
using gpurun::snapshot::SnapshotHeader;
using gpurun::testing::contains;
using gpurun::testing::what_of;
using gpurun::testing::snapshot::FakePinner;
using gpurun::testing::snapshot::pattern;
using gpurun::testing::snapshot::poke;

const std::string kManifest = R"({"modules":{"m":["w","b"]}})";

// One snapshot written the way write_snapshot does it: begin, the tensors at their offsets,
// commit with the payload digest of the mapping. Returns the header commit() read back.
SnapshotHeader write_one(SnapshotFile& f, const std::vector<std::vector<uint8_t>>& tensors) {
  std::vector<uint64_t> sizes, offsets;
  for (const auto& t : tensors) sizes.push_back(t.size());
  const SnapshotHeader plan = SnapshotHeader::plan(kManifest.size(), sizes, offsets);
  f.begin(plan, kManifest);
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!tensors[i].empty())  // an empty vector's data() may be null: not for memcpy
      std::memcpy(f.data() + offsets[i], tensors[i].data(), tensors[i].size());
  return f.commit(
      payload_digest(f.data() + SnapshotHeader::kBytes, plan.data_end - SnapshotHeader::kBytes));
}

}  // namespace

TEST_CASE("snapshot file: begin, tensors, commit; another mapping reads it back byte-equal") {
  gpurun::testing::TempDir dir("gpurun-snap");
  const std::string path = dir.str() + "/state.snap";
  const std::vector<std::vector<uint8_t>> tensors = {pattern(100'003, 1), pattern(64, 2),
                                                     pattern(0, 3), pattern(4097, 4)};
  std::optional<SnapshotFile> f = SnapshotFile::create(path, 256 << 10, /*replace=*/false);
  REQUIRE(f.has_value());
  // A new file holds no snapshot yet.
  CHECK(contains(what_of([&] { SnapshotHeader::decode(f->data(), f->size(), path); }),
                 "holds no snapshot yet"));
  const SnapshotHeader written = write_one(*f, tensors);
  CHECK(written.committed);
  CHECK(written.sequence == 1);
  CHECK(written.writer_pid == static_cast<uint64_t>(::getpid()));

  // A reader (a resuming process) maps the file afresh.
  const SnapshotFile r = SnapshotFile::open(path);
  const SnapshotHeader h = SnapshotHeader::decode(r.data(), r.size(), path);
  CHECK(h.committed);
  CHECK(h.sequence == 1);
  CHECK(h.file_bytes == r.size());
  CHECK(h.tensor_count == tensors.size());
  CHECK(h.payload_bytes == h.data_end - SnapshotHeader::kBytes);
  CHECK(h.payload_checksum ==
        payload_digest(r.data() + SnapshotHeader::kBytes, h.data_end - SnapshotHeader::kBytes));
  CHECK_NOTHROW(h.check_payload(r.data(), path));
  CHECK(std::string(reinterpret_cast<const char*>(r.data()) + SnapshotHeader::kBytes,
                    h.manifest_bytes) == kManifest);
  std::vector<uint64_t> sizes, offsets;
  for (const auto& t : tensors) sizes.push_back(t.size());
  SnapshotHeader::plan(kManifest.size(), sizes, offsets);
  for (size_t i = 0; i < tensors.size(); ++i) {
    CAPTURE(i);
    CHECK(offsets[i] % SnapshotHeader::kAlignment == 0);
    CHECK(std::vector<uint8_t>(r.data() + offsets[i], r.data() + offsets[i] + tensors[i].size()) ==
          tensors[i]);
  }
  uint64_t data_end = 0, manifest_bytes = 0;
  CHECK(SnapshotHeader::peek_sizes(path, data_end, manifest_bytes));
  CHECK(data_end == h.data_end);
  CHECK(manifest_bytes == kManifest.size());

  // The next snapshot in the same file: sequence 2, the new bytes.
  const std::vector<std::vector<uint8_t>> next = {pattern(100'003, 9), pattern(64, 8),
                                                  pattern(0, 7), pattern(4097, 6)};
  CHECK(write_one(*f, next).sequence == 2);
  const SnapshotHeader h2 = SnapshotHeader::decode(r.data(), r.size(), path);  // shared file
  CHECK(h2.sequence == 2);
  CHECK_NOTHROW(h2.check_payload(r.data(), path));
  CHECK(std::memcmp(r.data() + offsets[0], next[0].data(), next[0].size()) == 0);
}

TEST_CASE("snapshot file: a writer stopped between begin and commit leaves no valid snapshot") {
  gpurun::testing::TempDir dir("gpurun-snap");
  const std::string path = dir.str() + "/state.snap";
  std::optional<SnapshotFile> f = SnapshotFile::create(path, 64 << 10, /*replace=*/false);
  REQUIRE(f.has_value());
  write_one(*f, {pattern(1000, 1)});
  const SnapshotFile r = SnapshotFile::open(path);
  REQUIRE_NOTHROW(SnapshotHeader::decode(r.data(), r.size(), path));

  // Snapshot #2 begins and its writer dies before commit(): the old one is void at once and
  // the new one is refused, naming the file, the writer and the snapshot.
  std::vector<uint64_t> offsets;
  f->begin(SnapshotHeader::plan(kManifest.size(), {1000}, offsets), kManifest);
  std::memcpy(f->data() + offsets[0], pattern(500, 2).data(), 500);  // half the tensor
  const std::string err = what_of([&] { SnapshotHeader::decode(r.data(), r.size(), path); });
  CHECK(contains(err, "'" + path + "' is incomplete"));
  CHECK(contains(err, "pid " + std::to_string(::getpid())));
  CHECK(contains(err, "snapshot #2"));
  uint64_t data_end = 0, manifest_bytes = 0;
  CHECK_FALSE(SnapshotHeader::peek_sizes(path, data_end, manifest_bytes));
}

TEST_CASE("snapshot file: a byte changed after the commit is found, naming the file") {
  gpurun::testing::TempDir dir("gpurun-snap");
  const std::string path = dir.str() + "/state.snap";
  std::optional<SnapshotFile> f = SnapshotFile::create(path, 64 << 10, /*replace=*/false);
  REQUIRE(f.has_value());
  const SnapshotHeader w = write_one(*f, {pattern(5000, 1), pattern(3000, 2)});
  f.reset();

  SUBCASE("a tensor byte: the payload checksum") {
    poke(path, w.data_end - 1);
    const SnapshotFile r = SnapshotFile::open(path);
    const SnapshotHeader h = SnapshotHeader::decode(r.data(), r.size(), path);  // header fine
    const std::string err = what_of([&] { h.check_payload(r.data(), path); });
    CHECK(contains(err, "state snapshot '" + path + "': payload checksum"));
    CHECK(contains(err, "(file corrupt"));
  }
  SUBCASE("a header byte: the header checksum") {
    poke(path, 64);  // writer_pid
    const SnapshotFile r = SnapshotFile::open(path);
    const std::string err = what_of([&] { SnapshotHeader::decode(r.data(), r.size(), path); });
    CHECK(contains(err, "'" + path + "': header checksum"));
  }
  SUBCASE("a manifest byte: the manifest hash") {
    poke(path, SnapshotHeader::kBytes + 2);
    const SnapshotFile r = SnapshotFile::open(path);
    const std::string err = what_of([&] { SnapshotHeader::decode(r.data(), r.size(), path); });
    CHECK(contains(err, "'" + path + "' is corrupt: its manifest"));
  }
}

TEST_CASE("snapshot file: a file that is not a whole snapshot is refused with what is wrong") {
  gpurun::testing::TempDir dir("gpurun-snap");
  const std::string path = dir.str() + "/state.snap";
  const auto decode_error = [&] {
    return what_of([&] {
      const SnapshotFile r = SnapshotFile::open(path);
      SnapshotHeader::decode(r.data(), r.size(), path);
    });
  };
  const auto write_file = [&](const std::vector<uint8_t>& bytes) {
    ::unlink(path.c_str());
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  };
  // A good snapshot to cut and change.
  std::vector<uint8_t> good;
  {
    std::optional<SnapshotFile> f = SnapshotFile::create(path, 64 << 10, /*replace=*/false);
    REQUIRE(f.has_value());
    write_one(*f, {pattern(2000, 1)});
    good.assign(f->data(), f->data() + f->size());
  }

  SUBCASE("cut short") {
    write_file(std::vector<uint8_t>(good.begin(), good.begin() + good.size() / 2));
    CHECK(contains(decode_error(), "'" + path +
                                       "' is truncated: " + std::to_string(good.size() / 2) +
                                       " of " + std::to_string(good.size()) + " bytes"));
  }
  SUBCASE("shorter than the header") {
    write_file(std::vector<uint8_t>(good.begin(), good.begin() + 10));
    CHECK(contains(decode_error(), "'" + path + "' is truncated: 10 bytes, shorter than"));
  }
  SUBCASE("empty") {
    write_file({});
    CHECK(contains(decode_error(), "'" + path + "' is truncated: 0 bytes"));
  }
  SUBCASE("trailing bytes") {
    std::vector<uint8_t> longer = good;
    longer.resize(good.size() + 4096);
    write_file(longer);
    CHECK(contains(decode_error(), "trailing bytes"));
  }
  SUBCASE("wrong magic") {
    std::vector<uint8_t> other = good;
    other[0] = 'X';
    write_file(other);
    CHECK(contains(decode_error(), "'" + path + "' is not a gpurun state snapshot (wrong magic"));
  }
  SUBCASE("another format version") {
    std::vector<uint8_t> other = good;
    other[8] = 3;  // version u32 at 8
    write_file(other);
    CHECK(contains(decode_error(), "'" + path + "' has format version 3"));
  }
  SUBCASE("a FIFO (never blocks)") {
    ::unlink(path.c_str());
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    CHECK(contains(decode_error(), "'" + path + "' is a FIFO"));
    uint64_t data_end = 0, manifest_bytes = 0;
    CHECK_FALSE(SnapshotHeader::peek_sizes(path, data_end, manifest_bytes));
  }
  SUBCASE("a directory") {
    ::unlink(path.c_str());
    REQUIRE(::mkdir(path.c_str(), 0700) == 0);
    const std::string err = decode_error();
    CHECK(contains(err, "'" + path + "'"));
    CHECK(contains(err, "directory"));
  }
  SUBCASE("no file") {
    ::unlink(path.c_str());
    CHECK(contains(decode_error(), "'" + path + "' failed: No such file or directory"));
    uint64_t data_end = 0, manifest_bytes = 0;
    CHECK_FALSE(SnapshotHeader::peek_sizes(path, data_end, manifest_bytes));
  }
}

TEST_CASE("snapshot file: create never overwrites unless told; is_at sees a replaced file") {
  gpurun::testing::TempDir dir("gpurun-snap");
  const std::string path = dir.str() + "/state.snap";
  std::optional<SnapshotFile> first = SnapshotFile::create(path, 64 << 10, /*replace=*/false);
  REQUIRE(first.has_value());
  write_one(*first, {pattern(100, 1)});
  CHECK(first->is_at(path));
  // Another rank preparing the same path: no file of its own, the first one stays.
  CHECK_FALSE(SnapshotFile::create(path, 128 << 10, /*replace=*/false).has_value());
  CHECK(first->is_at(path));
  // A replacing create: the first mapping sees it is no longer the file at the path.
  std::optional<SnapshotFile> second = SnapshotFile::create(path, 128 << 10, /*replace=*/true);
  REQUIRE(second.has_value());
  CHECK_FALSE(first->is_at(path));
  CHECK(second->is_at(path));
  CHECK_NOTHROW(SnapshotFile::open(path));
  // MappedFile::create refuses an existing path, naming it.
  CHECK(contains(what_of([&] { MappedFile::create(path, 4096); }),
                 "creating '" + path + "' failed: File exists"));
  // No temporary file is left next to it.
  CHECK(gpurun::testing::snapshot::entries(dir.str()) == std::vector<std::string>{"state.snap"});
}

TEST_CASE("snapshot file: page-locking goes through the installed HostPinner") {
  gpurun::testing::TempDir dir("gpurun-snap");
  const std::string path = dir.str() + "/state.snap";
  FakePinner pinner;  // installed; uninstalled when it goes
  {
    std::optional<SnapshotFile> f = SnapshotFile::create(path, 64 << 10, /*replace=*/false);
    REQUIRE(f.has_value());
    CHECK_FALSE(f->pinned());
    CHECK(f->pin() >= 0);
    CHECK(f->pinned());
    REQUIRE(pinner.calls->size() == 1);
    CHECK(pinner.calls->at(0).data == f->data());
    CHECK(pinner.calls->at(0).bytes == f->size());
    CHECK_FALSE(pinner.calls->at(0).read_only);
    CHECK(f->pin() == 0);  // idempotent: no second registration
    CHECK(pinner.calls->size() == 1);
    write_one(*f, {pattern(3000, 1)});  // a pinned file is written as any other
    CHECK(*pinner.unpinned == 0);
    f->unpin();
    CHECK(*pinner.unpinned == 1);
    CHECK_FALSE(f->pinned());
    f->pin();
    CHECK(pinner.calls->size() == 2);
  }
  CHECK(*pinner.unpinned == 2);  // unpinned when the file goes (before it is unmapped)

  // A pinner that cannot pin (no device): not pinned, nothing else changes.
  pinner.refuse = true;
  {
    SnapshotFile f = SnapshotFile::open(path);
    f.pin();
    CHECK_FALSE(f.pinned());
    CHECK_NOTHROW(SnapshotHeader::decode(f.data(), f.size(), path));
  }
  // Left to the process's end: the registration is forgotten, not undone.
  pinner.refuse = false;
  {
    SnapshotFile f = SnapshotFile::open(path);
    f.pin();
    REQUIRE(f.pinned());
    f.leave_to_exit();
    CHECK(*pinner.left == 1);
    CHECK(f.data() == nullptr);
  }
  CHECK(*pinner.unpinned == 2);
}

TEST_CASE("snapshot file: without a HostPinner pin() does nothing") {
  gpurun::testing::TempDir dir("gpurun-snap");
  std::optional<SnapshotFile> f =
      SnapshotFile::create(dir.str() + "/state.snap", 64 << 10, /*replace=*/false);
  REQUIRE(f.has_value());
  f->pin();
  CHECK_FALSE(f->pinned());
}
