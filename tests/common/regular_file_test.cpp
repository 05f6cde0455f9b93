// gpurun::read_regular_file and every reader built on it (docs/errors.md, "Files gpurun
// reads"): a FIFO nobody writes, /dev/zero, a directory, a symlink loop, a file over the
// bound and an unreadable file each give an error naming the path and what it is, within
// 1 s — never a hang (a watchdog ends the test naming the row that blocked), never unbounded
// memory. Then replace_file_if_unchanged: an edit that crosses the read-modify-write is kept.
#include "gpurun/regular_file.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <boost/asio/io_context.hpp>

#include "check_text.hpp"
#include "commands/policy_command.hpp"
#include "commands/status_command.hpp"
#include "control/config.hpp"
#include "control/lease_keeper.hpp"
#include "control/status.hpp"
#include "energy/early_stop.hpp"
#include "energy/power_journal.hpp"
#include "energy/power_profiler.hpp"
#include "gpurun/sanitizers.hpp"
#include "gpurun_process.hpp"
#include "report/event_log.hpp"

namespace fs = std::filesystem;
using gpurun::testing::contains;
using gpurun::testing::TempDir;

namespace {

/// Ends the process (exit 1) naming `row` if the scope is still open after `limit`: a reader
/// that blocks on a FIFO never returns, so the test must not wait for it.
class Watchdog {
 public:
  Watchdog(std::string row, std::chrono::seconds limit)
      : row_(std::move(row)), thread_([this, limit] {
          std::unique_lock<std::mutex> lock(mu_);
          if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
            std::fprintf(stderr, "FAILED: %s is still blocked after %lld s\n", row_.c_str(),
                         static_cast<long long>(limit.count()));
            std::_Exit(1);
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  std::string row_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

/// A bad file of one kind at `path`; false (with `why`) when this machine cannot make it.
struct Kind {
  std::string name;
  std::function<bool(const fs::path& path, std::size_t bound, std::string& why)> make;
  std::string says;  ///< what the message must hold
};

std::vector<Kind> kinds() {
  return {
      {"a FIFO nobody writes",
       [](const fs::path& p, std::size_t, std::string&) { return ::mkfifo(p.c_str(), 0600) == 0; },
       "it is a FIFO, not a regular file"},
      {"a symlink to /dev/zero",
       [](const fs::path& p, std::size_t, std::string&) {
         return ::symlink("/dev/zero", p.c_str()) == 0;
       },
       "it is a character device, not a regular file"},
      {"a directory",
       [](const fs::path& p, std::size_t, std::string&) { return ::mkdir(p.c_str(), 0700) == 0; },
       "it is a directory, not a regular file"},
      {"a symlink loop",
       [](const fs::path& p, std::size_t, std::string&) {
         const std::string other = p.string() + ".loop";
         return ::symlink(other.c_str(), p.c_str()) == 0 &&
                ::symlink(p.c_str(), other.c_str()) == 0;
       },
       "a symlink loop"},
      {"a file over the bound",
       [](const fs::path& p, std::size_t bound, std::string&) {
         // Sparse: the size says it all, no bytes are written or read.
         const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
         const bool ok = fd >= 0 && ::ftruncate(fd, static_cast<off_t>(bound) + 1) == 0;
         if (fd >= 0) ::close(fd);
         return ok;
       },
       "more than the limit of"},
      {"an unreadable file (mode 000)",
       [](const fs::path& p, std::size_t, std::string& why) {
         { std::ofstream(p) << "{}\n"; }
         ::chmod(p.c_str(), 0);
         const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
         if (fd >= 0) {  // root (CAP_DAC_OVERRIDE) reads it anyway
           ::close(fd);
           why = "this test runs with the right to read a mode-000 file (root?)";
           return false;
         }
         return true;
       },
       "unreadable: Permission denied"},
  };
}

/// One reader: where its file is, its bound, and what it says (the error text, "" if none).
struct Reader {
  std::string name;
  std::size_t bound;
  std::function<fs::path(const fs::path& dir)> file;  ///< the path the reader reads
  std::function<std::string(const fs::path& dir)> run;
};

/// Runs `f` with fd `fd` (1 or 2) sent to a file; returns what it wrote.
std::string captured(int fd, const fs::path& into, const std::function<void()>& f) {
  std::fflush(nullptr);
  const int saved = ::dup(fd);
  const int out = ::open(into.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REQUIRE(out >= 0);
  ::dup2(out, fd);
  ::close(out);
  f();
  std::fflush(nullptr);
  ::dup2(saved, fd);
  ::close(saved);
  return gpurun::testing::slurp(into);
}

/// A status.json that names a config, so lend/reclaim go on to the leases file.
void write_status(const fs::path& dir) {
  std::ofstream(dir / "status.json")
      << R"({"run_id": "r", "config": ")" << (dir / "config.toml").string()
      << R"(", "slots": [{"gpu": 0}, {"gpu": 1}], "current_active": [0, 1]})"
      << "\n";
  std::ofstream(dir / "config.toml") << "active_gpus = [0, 1]\n";
}

std::vector<Reader> readers() {
  namespace c = gpurun::control;
  namespace e = gpurun::energy;
  using gpurun::testing::what_of;
  const auto in = [](const char* name) {
    return [name](const fs::path& dir) { return dir / name; };
  };
  return {
      {"read_regular_file", 4096, in("f"),
       [](const fs::path& d) {
         return what_of([&] { gpurun::read_regular_file(d / "f", 4096); });
       }},
      {"read_regular_file_if_exists", 4096, in("f"),
       [](const fs::path& d) {
         return what_of([&] { gpurun::read_regular_file_if_exists(d / "f", 4096); });
       }},
      {"config load (load_config)", c::kMaxConfigBytes, in("config.toml"),
       [](const fs::path& d) { return what_of([&] { c::load_config(d / "config.toml", {0}); }); }},
      {"lease load (read_leases)", std::size_t{1} << 20, in("leases.json"),
       [](const fs::path& d) {
         return what_of([&] { c::read_leases((d / "leases.json").string()); });
       }},
      {"gpurun lend (leases.json)", std::size_t{1} << 20, in("leases.json"),
       [](const fs::path& d) {
         write_status(d);
         int code = 0;
         const std::string err = captured(2, d / "err.txt", [&] {
           captured(1, d / "out.txt", [&] {
             code = gpurun::commands::lend_command({"1", "--run-dir", d});
           });
         });
         CHECK(code == 1);
         return err;
       }},
      {"gpurun set (config.toml)", c::kMaxConfigBytes, in("cfg.toml"),
       [](const fs::path& d) {
         int code = 0;
         const std::string err = captured(2, d / "err.txt", [&] {
           captured(1, d / "out.txt", [&] {
             code = gpurun::commands::set_command(
                 {"park.mode=hold", "--config", (d / "cfg.toml").string()});
           });
         });
         CHECK(code == 1);
         return err;
       }},
      {"gpurun status (status.json)", gpurun::kDefaultMaxFileBytes, in("status.json"),
       [](const fs::path& d) {
         int code = 0;
         const std::string err = captured(2, d / "err.txt", [&] {
           captured(1, d / "out.txt", [&] {
             code = gpurun::commands::status_command({"--run-dir", d});
           });
         });
         CHECK(code == 1);
         return err;
       }},
      {"profile cache load (cached_limit)", gpurun::kDefaultMaxFileBytes, in("cache.json"),
       [](const fs::path& d) {
         return what_of([&] { e::cached_limit(d / "cache.json", {"p", "k", "GPU", 1, 0.5}); });
       }},
      {"history load (best_cost)", e::kMaxHistoryBytes, in("history.jsonl"),
       [](const fs::path& d) { return what_of([&] { e::best_cost(d / "history.jsonl", "j"); }); }},
      {"power journal (read_journal)", gpurun::kDefaultMaxFileBytes, in("journal.json"),
       [](const fs::path& d) { return what_of([&] { e::read_journal(d / "journal.json"); }); }},
      // Streamed, not bounded as a whole: "over the bound" is one line over 1 MiB.
      {"event log (gpurun report's read_log)", std::size_t{1} << 20, in("run.jsonl"),
       [](const fs::path& d) {
         return what_of([&] { gpurun::report::detail::read_log((d / "run.jsonl").string()); });
       }},
  };
}

/// Resident memory of this process (VmRSS of /proc/self/status, KiB).
long resident_kib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return 0;
}

// AddressSanitizer's and ThreadSanitizer's shadow memory needs terabytes of address space.
constexpr bool kAddressSpaceCappable = !gpurun::kAddressSanitizer && !gpurun::kThreadSanitizer;

}  // namespace

TEST_CASE(
    "every reader refuses a FIFO, /dev/zero, a directory, a loop, a huge or unreadable "
    "file within 1 s, naming the path") {
  // A reader that reads /dev/zero into memory fails here instead of taking the machine (not
  // under AddressSanitizer or ThreadSanitizer, whose shadow memory needs terabytes of address
  // space; there the resident-memory check below and the watchdog catch it).
  struct rlimit as {};
  ::getrlimit(RLIMIT_AS, &as);
  if (kAddressSpaceCappable) {
    const struct rlimit capped { std::min<rlim_t>(as.rlim_cur, rlim_t{4} << 30), as.rlim_max };
    ::setrlimit(RLIMIT_AS, &capped);
  }
  std::set<std::string> skipped;
  for (const Reader& reader : readers()) {
    for (const Kind& kind : kinds()) {
      const std::string row = reader.name + " × " + kind.name;
      CAPTURE(row);
      TempDir dir("gpurun-reader");
      const fs::path file = reader.file(dir.path);
      std::string why;
      if (!kind.make(file, reader.bound, why)) {
        REQUIRE_MESSAGE(!why.empty(), "cannot make " << kind.name << " at " << file);
        if (skipped.insert(kind.name).second)
          MESSAGE("skipped for every reader: " << kind.name << ": " << why);
        continue;
      }
      const long rss_before_kib = resident_kib();
      const auto start = std::chrono::steady_clock::now();
      std::string said;
      {
        Watchdog watchdog(row, std::chrono::seconds(5));
        said = reader.run(dir.path);
      }
      const auto took = std::chrono::steady_clock::now() - start;
      // The bound is 16 MiB at most (the huge row reads none of it): resident memory stays.
      CHECK_MESSAGE(
          resident_kib() - rss_before_kib < 64 * 1024,
          row << " grew resident memory by " << resident_kib() - rss_before_kib << " KiB");
      CHECK_MESSAGE(took < std::chrono::seconds(1),
                    row << " took " << std::chrono::duration<double>(took).count() << " s");
      CHECK_MESSAGE(contains(said, file.string()), row << " said: " << said);
      CHECK_MESSAGE(contains(said, kind.says), row << " said: " << said);
      ::chmod(file.c_str(), 0600);  // so that the directory can be removed
    }
  }
  if (kAddressSpaceCappable) ::setrlimit(RLIMIT_AS, &as);
}

TEST_CASE("read_regular_file reads a regular file whole, up to exactly the bound") {
  TempDir dir("gpurun-reader");
  const fs::path f = dir.path / "f";
  std::ofstream(f) << std::string(4096, 'x');
  const gpurun::FileContent c = gpurun::read_regular_file(f, 4096);
  CHECK(c.bytes == std::string(4096, 'x'));
  CHECK(c.identity == *gpurun::file_identity(f));
  CHECK_FALSE(gpurun::read_regular_file_if_exists(dir.path / "missing").has_value());
  CHECK(gpurun::testing::what_of([&] { gpurun::read_regular_file(dir.path / "missing"); }) ==
        "cannot read the file " + (dir.path / "missing").string() + ": it does not exist");
  CHECK(gpurun::testing::what_of([&] { gpurun::read_regular_file(f, 4095, "the config file"); }) ==
        "cannot read the config file " + f.string() +
            ": it is 4096 bytes, more than the limit of 4095 bytes");
}

// ---- crossed edits ---------------------------------------------------------------------------

TEST_CASE("replace_file_if_unchanged: an edit between the read and the rename is kept") {
  TempDir dir("gpurun-replace");
  const fs::path f = dir.path / "config.toml";
  std::ofstream(f) << "a = 1\n";
  for (const char* step : {"before_check", "before_rename"}) {
    CAPTURE(step);
    std::ofstream(f, std::ios::trunc) << "a = 1\n";
    const gpurun::FileContent before = gpurun::read_regular_file(f);
    // The hand edit: an editor's save (a new file renamed over the old one).
    const auto edit = [&](std::string_view at) {
      if (at != step) return;
      std::ofstream(dir.path / "edit") << "a = 1\nb = 2\n";
      fs::rename(dir.path / "edit", f);
    };
    CHECK_FALSE(gpurun::replace_file_if_unchanged(f, before, "a = 5\n", 0644, edit));
    CHECK(gpurun::read_regular_file(f).bytes == "a = 1\nb = 2\n");
    // In place (same inode, same size: only the content tells).
    std::ofstream(f, std::ios::trunc) << "a = 1\n";
    const gpurun::FileContent again = gpurun::read_regular_file(f);
    const auto in_place = [&](std::string_view at) {
      if (at != step) return;
      std::fstream(f, std::ios::in | std::ios::out) << "a = 7\n";
      const int64_t ns = again.identity.mtime_ns;
      const struct timespec times[2] = {{0, UTIME_OMIT}, {ns / 1'000'000'000, ns % 1'000'000'000}};
      ::utimensat(AT_FDCWD, f.c_str(), times, 0);  // the same mtime: only the content tells
    };
    CHECK_FALSE(gpurun::replace_file_if_unchanged(f, again, "a = 5\n", 0644, in_place));
    CHECK(gpurun::read_regular_file(f).bytes == "a = 7\n");
  }
  // Unchanged: replaced, with the mode asked for, and no temp file left.
  const gpurun::FileContent now = gpurun::read_regular_file(f);
  CHECK(gpurun::replace_file_if_unchanged(f, now, "a = 5\n", 0640));
  CHECK(gpurun::read_regular_file(f).bytes == "a = 5\n");
  CHECK((fs::status(f).permissions() & fs::perms::all) ==
        (fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read));
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path)) ++files;
  CHECK(files == 1);
  // Expected missing: a file that appeared meanwhile is not replaced.
  const fs::path g = dir.path / "leases.json";
  CHECK_FALSE(gpurun::replace_file_if_unchanged(g, std::nullopt, "x\n", 0644, [&](auto at) {
    if (at == "before_rename") std::ofstream(g) << "hand\n";
  }));
  CHECK(gpurun::read_regular_file(g).bytes == "hand\n");
}

TEST_CASE("gpurun set keeps a hand edit made between its read and its rename") {
  TempDir dir("gpurun-set-race");
  const fs::path config = dir.path / "config.toml";
  std::ofstream(config) << "active_gpus = [0, 1]\n\n[park]\nmode = \"release\"\n";
  int edits = 0;
  const auto hand_edit = [&](std::string_view at) {
    if (at != "before_rename" || edits++ > 0) return;
    // The user changes [park] by hand while gpurun set is at work (vim: write + rename).
    std::ofstream(dir.path / "edit") << "active_gpus = [0, 1]\n\n[park]\nmode = \"hold\"\n";
    fs::rename(dir.path / "edit", config);
  };
  int code = -1;
  const std::string out = captured(1, dir.path / "out.txt", [&] {
    code = gpurun::commands::set_command({"active_gpus=0", "--config", config.string()}, hand_edit);
  });
  CHECK(code == 0);
  CHECK(edits == 2);  // the edit, then the second round found the file unchanged
  const std::string text = gpurun::read_regular_file(config).bytes;
  CHECK_MESSAGE(contains(text, "mode = \"hold\""), text);    // the hand edit is kept
  CHECK_MESSAGE(contains(text, "active_gpus = [0]"), text);  // and set's change landed
  CHECK(contains(out, "active_gpus=0"));
}

TEST_CASE("gpurun set refuses, writing nothing, when the file keeps changing under it") {
  TempDir dir("gpurun-set-race");
  const fs::path config = dir.path / "config.toml";
  std::ofstream(config) << "active_gpus = [0, 1]\n";
  int round = 0;
  const auto always = [&](std::string_view at) {
    if (at != "before_check") return;
    std::ofstream(config, std::ios::trunc) << "active_gpus = [0, 1]\n# edit " << ++round << "\n";
  };
  int code = -1;
  const std::string err = captured(2, dir.path / "err.txt", [&] {
    code = gpurun::commands::set_command({"active_gpus=0", "--config", config.string()}, always);
  });
  CHECK(code == 1);
  CHECK_MESSAGE(contains(err, "changed 5 times while gpurun set rewrote it"), err);
  CHECK_MESSAGE(contains(err, "the change was not written"), err);
  CHECK(gpurun::read_regular_file(config).bytes == "active_gpus = [0, 1]\n# edit 5\n");
}

TEST_CASE("gpurun lend and reclaim keep a hand edit of leases.json made while they work") {
  TempDir dir("gpurun-lend-race");
  write_status(dir.path);
  const fs::path leases = dir.path / "leases.json";
  const std::string hand = R"({"leases": [{"gpus": [0], "since_ms": 1, "until_ms": null, )"
                           R"("note": "by hand"}]})"
                           "\n";
  int edits = 0;
  const auto hand_edit = [&](std::string_view at) {
    if (at == "before_rename" && edits++ == 0) std::ofstream(leases) << hand;
  };
  int code = -1;
  captured(1, dir.path / "out.txt", [&] {
    code = gpurun::commands::lend_command({"1", "--run-dir", dir.str()}, hand_edit);
  });
  CHECK(code == 0);
  std::vector<gpurun::control::Lease> now = gpurun::control::read_leases(leases.string());
  REQUIRE(now.size() == 2);  // the hand's lease of GPU 0 and lend's of GPU 1
  CHECK(now[0].note == "by hand");
  CHECK(now[1].gpus == std::vector<int>{1});
  // reclaim 1 while GPU 0's lease is edited by hand (another note): both land.
  edits = 0;
  const auto note_edit = [&](std::string_view at) {
    if (at != "before_rename" || edits++ > 0) return;
    std::string text = gpurun::read_regular_file(leases).bytes;
    text.replace(text.find("by hand"), 7, "edited!");
    std::ofstream(leases, std::ios::trunc) << text;
  };
  captured(1, dir.path / "out.txt", [&] {
    code = gpurun::commands::reclaim_command({"1", "--run-dir", dir.str()}, note_edit);
  });
  CHECK(code == 0);
  now = gpurun::control::read_leases(leases.string());
  REQUIRE(now.size() == 1);
  CHECK(now[0].gpus == std::vector<int>{0});
  CHECK(now[0].note == "edited!");
}

TEST_CASE("the status writer says once that status.json was changed by another process") {
  TempDir dir("gpurun-status-cross");
  boost::asio::io_context io;
  std::vector<std::string> said;
  int n = 0;
  gpurun::control::StatusWriter writer(
      io, dir.str(), [&] { return fmt::format("{{\"n\": {}}}", ++n); },
      [&](const std::string& e) { said.push_back(e); }, std::chrono::milliseconds(0));
  const fs::path status = dir.path / "status.json";
  writer.publish();
  writer.publish();
  CHECK(said.empty());  // its own writes are not a crossing
  for (int round = 0; round < 2; ++round) {
    std::ofstream(dir.path / "other") << "{\"someone\": \"else\"}\n";
    fs::rename(dir.path / "other", status);
    writer.publish();
  }
  REQUIRE(said.size() == 1);  // once, not on every write
  CHECK_MESSAGE(contains(said[0], status.string() + " was changed or replaced by another process"),
                said[0]);
  CHECK(gpurun::read_regular_file(status).bytes == "{\"n\": 4}\n");
}

TEST_CASE(
    "replace_file_if_unchanged: a writer that opened the file before the rename and "
    "writes after it is waited for and its write kept") {
  TempDir dir("gpurun-replace");
  const fs::path f = dir.path / "config.toml";
  std::ofstream(f) << "a = 1\n";
  const gpurun::FileContent before = gpurun::read_regular_file(f);
  std::thread writer;
  const auto open_then_write_later = [&](std::string_view at) {
    if (at != "before_rename") return;
    // `echo x >> config.toml` caught between its open() and its write(): the write lands on
    // the file the rename takes away (before: silently lost).
    const int fd = ::open(f.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    REQUIRE(fd >= 0);
    writer = std::thread([fd] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      CHECK(::write(fd, "b = 2\n", 6) == 6);
      ::close(fd);
    });
  };
  CHECK_FALSE(gpurun::replace_file_if_unchanged(f, before, "a = 5\n", 0644, open_then_write_later));
  writer.join();
  CHECK(gpurun::read_regular_file(f).bytes == "a = 1\nb = 2\n");
}

// An editor-style save (`sed -i`: read the path, write a temp file, rename it over the path).
// These rows use the hook's steps, never timing: what the path holds at each step is what an
// editor reading it then would read.
namespace {

/// `sed -i '$a LINE' f`, split in its two halves: read() takes the path's bytes now, save()
/// renames them plus LINE over the path later.
struct RenameEditor {
  explicit RenameEditor(fs::path f) : file(std::move(f)) {}
  fs::path file;
  std::string read_bytes;
  bool has_read = false;
  void read() {
    read_bytes = gpurun::read_regular_file(file).bytes;
    has_read = true;
  }
  void save(const std::string& line) {
    const fs::path tmp = file.string() + ".sed-tmp";
    std::ofstream(tmp) << read_bytes << line << "\n";
    fs::rename(tmp, file);
  }
};

}  // namespace

TEST_CASE(
    "replace_file_if_unchanged: a save renamed over the file just before the exchange is put "
    "back at once, before any wait, and an editor reading then keeps it") {
  TempDir dir("gpurun-replace");
  const fs::path f = dir.path / "config.toml";
  std::ofstream(f) << "a = 1\n";
  const gpurun::FileContent before = gpurun::read_regular_file(f);
  RenameEditor hand51(f), hand52(f);
  std::vector<std::pair<std::string, std::string>> seen;  // step, what the path held
  bool exchanged = false;
  const auto hook = [&](std::string_view at) {
    if (at == "before_rename") {  // `# hand 51` lands after set's check, before its exchange
      hand51.read();
      hand51.save("# hand 51");
      return;
    }
    if (at == "exchanged") {  // the one moment gpurun's version must be at the path
      exchanged = true;
      return;
    }
    if (!exchanged) return;
    seen.emplace_back(at, gpurun::read_regular_file(f).bytes);
    if (!hand52.has_read) hand52.read();  // the next `sed -i` reads at the next step
  };
  CHECK_FALSE(gpurun::replace_file_if_unchanged(f, before, "a = 5\n", 0644, hook));
  // After the exchange, the next step is the swap back: gpurun's version was at the path only
  // between the exchange and the swap (before: through the wait for writers, ~100 ms).
  REQUIRE_FALSE(seen.empty());
  CHECK(seen.front().first == "swapped_back");
  for (const auto& entry : seen)  // not a structured binding: clang 14 cannot capture one
    CHECK_MESSAGE(entry.second != "a = 5\n", "at " << entry.first);
  hand52.save("# hand 52");  // sed #52 renames what it read over the path
  const std::string text = gpurun::read_regular_file(f).bytes;
  CHECK_MESSAGE(text == "a = 1\n# hand 51\n# hand 52\n", text);  // both hand edits kept
}

TEST_CASE(
    "replace_file_if_unchanged: a save renamed over gpurun's version right after the exchange "
    "is kept and no success is reported") {
  TempDir dir("gpurun-replace");
  const fs::path f = dir.path / "config.toml";
  std::ofstream(f) << "a = 1\n";
  const gpurun::FileContent before = gpurun::read_regular_file(f);
  RenameEditor hand(f);
  hand.read();  // the editor read the file before gpurun's exchange, saves after it
  const auto hook = [&](std::string_view at) {
    if (at == "exchanged") hand.save("# hand");
  };
  // Before: true, with "a = 5" in no file (the save replaced it).
  CHECK_FALSE(gpurun::replace_file_if_unchanged(f, before, "a = 5\n", 0644, hook));
  CHECK(gpurun::read_regular_file(f).bytes == "a = 1\n# hand\n");
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path)) ++files;
  CHECK(files == 1);  // no temp file left
}

TEST_CASE("gpurun set keeps a save that lands right after its exchange, and lands its change") {
  TempDir dir("gpurun-set-race");
  const fs::path config = dir.path / "config.toml";
  std::ofstream(config) << "active_gpus = [0, 1]\n\n[park]\nmode = \"release\"\n";
  RenameEditor hand(config);
  int saves = 0;
  const auto hook = [&](std::string_view at) {
    if (at == "before_rename" && saves == 0) hand.read();
    if (at == "exchanged" && saves++ == 0) hand.save("# hand");
  };
  int code = -1;
  const std::string out = captured(1, dir.path / "out.txt", [&] {
    code = gpurun::commands::set_command({"park.mode=hold", "--config", config.string()}, hook);
  });
  CHECK(code == 0);
  const std::string text = gpurun::read_regular_file(config).bytes;
  CHECK_MESSAGE(contains(text, "# hand"), text);           // the save is kept
  CHECK_MESSAGE(contains(text, "mode = \"hold\""), text);  // and set's change is in the file
}
