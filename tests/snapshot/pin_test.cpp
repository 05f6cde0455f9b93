// SnapshotFile's chunked page-locking (begin_chunked_pin, PinTask, wait_pinned) against a
// fake pinner: the frontier copies wait on, a refusing driver, and unpinning or dropping a
// file whose pin is still running on another thread.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gpurun/snapshot/snapshot_file.hpp"

namespace snap = gpurun::snapshot;

namespace {

constexpr size_t kChunk = size_t{1} << 20;

/// Records every registration (offset from the mapping, bytes) and how many are alive; may
/// refuse chunk `refuse_at` and may hold chunk `gate_at` until release().
struct FakePinner {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<size_t, size_t>> calls;
  std::atomic<int> alive{0};
  uint8_t* base = nullptr;
  int refuse_at = -1, gate_at = -1;
  bool gate_open = false, at_gate = false;

  struct Pin final : snap::HostPin {
    explicit Pin(std::atomic<int>& a) : alive(a) { ++alive; }
    ~Pin() override {
      if (!left) --alive;
    }
    void leave_to_exit() noexcept override { left = true; }
    std::atomic<int>& alive;
    bool left = false;
  };

  void install() {
    snap::set_host_pinner(
        [this](uint8_t* data, size_t bytes, bool) -> std::unique_ptr<snap::HostPin> {
          std::unique_lock<std::mutex> lock(mu);
          const int k = static_cast<int>(calls.size());
          calls.emplace_back(static_cast<size_t>(data - base), bytes);
          if (k == gate_at) {
            at_gate = true;
            cv.notify_all();
            cv.wait(lock, [&] { return gate_open; });
          }
          if (k == refuse_at) return nullptr;
          return std::make_unique<Pin>(alive);
        });
  }
  void wait_at_gate() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return at_gate; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    gate_open = true;
    cv.notify_all();
  }
  ~FakePinner() { snap::set_host_pinner({}); }
};

/// A snapshot file of 3.5 chunks in the temporary directory, removed at the end.
struct TempSnapshot {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("gpurun-pin-test-" + std::to_string(::getpid()) + ".snapshot"))
                         .string();
  std::optional<snap::SnapshotFile> file =
      snap::SnapshotFile::create(path, 3 * kChunk + kChunk / 2, /*replace=*/true);
  ~TempSnapshot() {
    file.reset();
    std::filesystem::remove(path);
  }
};

}  // namespace

TEST_CASE("chunked pin: every chunk in address order, the frontier, all undone by unpin") {
  FakePinner pinner;
  pinner.install();
  TempSnapshot t;
  REQUIRE(t.file);
  snap::SnapshotFile& f = *t.file;
  pinner.base = f.data();
  snap::PinTask task = f.begin_chunked_pin(kChunk);
  REQUIRE(task);
  CHECK_FALSE(f.begin_chunked_pin(kChunk));  // one pin per mapping
  CHECK_FALSE(f.pinned());
  std::thread runner([&] { task.run(); });
  CHECK(f.wait_pinned(2 * kChunk + 1));  // chunks 0-2 are enough for these bytes
  CHECK(f.wait_pinned(f.size()));
  runner.join();
  CHECK(f.pinned());
  CHECK(f.pin_chunk_bytes() == kChunk);
  CHECK(f.pin() == 0);  // already pinned: nothing more
  const std::vector<std::pair<size_t, size_t>> want{
      {0, kChunk}, {kChunk, kChunk}, {2 * kChunk, kChunk}, {3 * kChunk, kChunk / 2}};
  CHECK(pinner.calls == want);
  CHECK(pinner.alive == 4);
  f.unpin();
  CHECK(pinner.alive == 0);
  CHECK_FALSE(f.pinned());
}

TEST_CASE("chunked pin: a chunk the driver refuses ends the pin; waiting never hangs") {
  FakePinner pinner;
  pinner.refuse_at = 1;
  pinner.install();
  TempSnapshot t;
  REQUIRE(t.file);
  snap::SnapshotFile& f = *t.file;
  pinner.base = f.data();
  snap::PinTask task = f.begin_chunked_pin(kChunk);
  std::thread runner([&] { task.run(); });
  CHECK(f.wait_pinned(kChunk));            // chunk 0 is locked
  CHECK_FALSE(f.wait_pinned(kChunk + 1));  // chunk 1 never will be: false, at once
  runner.join();
  CHECK_FALSE(f.pinned());
  CHECK(pinner.calls.size() == 2);  // nothing after the refusal
  CHECK(pinner.alive == 1);
}

TEST_CASE("chunked pin: unpin and the destructor stop a running pin and wait for it") {
  for (const bool destroy : {false, true}) {
    CAPTURE(destroy);
    FakePinner pinner;
    pinner.gate_at = 1;
    pinner.install();
    TempSnapshot t;
    REQUIRE(t.file);
    pinner.base = t.file->data();
    snap::PinTask task = t.file->begin_chunked_pin(kChunk);
    std::thread runner([&] { task.run(); });
    pinner.wait_at_gate();  // the task is inside chunk 1's registration
    std::thread stopper([&] {
      if (destroy)
        t.file.reset();  // unmaps: must wait for the task first
      else
        t.file->unpin();
    });
    pinner.release();
    stopper.join();
    runner.join();
    CHECK(pinner.alive == 0);  // every registration undone, none left behind
  }
}

TEST_CASE("chunked pin: a task dropped unrun makes nobody wait; pin() waits for a running one") {
  FakePinner pinner;
  pinner.install();
  {
    TempSnapshot t;
    REQUIRE(t.file);
    { snap::PinTask dropped = t.file->begin_chunked_pin(kChunk); }
    CHECK_FALSE(t.file->wait_pinned(1));  // returns: no pin is running
    CHECK(pinner.calls.empty());
  }
  pinner.gate_at = 0;
  TempSnapshot t;
  REQUIRE(t.file);
  pinner.base = t.file->data();
  snap::PinTask task = t.file->begin_chunked_pin(kChunk);
  std::thread runner([&] { task.run(); });
  pinner.wait_at_gate();
  std::thread whole([&] { t.file->pin(); });
  pinner.release();
  whole.join();
  CHECK(t.file->pinned());  // pin() returned once the chunked pin was over
  runner.join();
  CHECK(pinner.calls.size() == 4);  // the chunked pin's: pin() made no registration of its own
}
