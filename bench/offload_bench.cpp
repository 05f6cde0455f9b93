// offload_bench: bandwidth of parking and unparking a worker's state through the host snapshot
// (StateRegistry::write_snapshot / read_snapshot, what the runtime calls at a pause and a
// resume), against the ceiling measured in the same run: plain copies of the same bytes into
// and out of a page-locked host buffer allocated once.
//
//   offload_bench [--device cpu|cuda] [--bytes N] [--tensors K] [--repeats R]
//                 [--path FILE] [--json FILE] [--no-verify]
//
// State: K float32 parameters sharing N bytes (default 4 GiB, K = 128) plus K small ones
// (16 KiB each, like biases), tracked by a StateRegistry; snapshot file on /dev/shm.
// Rows (GB/s = 1e9 bytes per second, medians of R runs where repeated):
//   ceiling D2H / H2D  one copy of N bytes between a device buffer and a pinned host buffer,
//                      and the same per state tensor (one stream, one synchronise); the
//                      ceiling is the faster of the two
//   first park         write_snapshot with no file yet: create + fallocate + mmap + register
//                      + copy + commit
//   park, repeated     write_snapshot into the file kept from the previous park (hold mode)
//   unpark, kept       release() then read_snapshot from the kept mapping (hold mode)
//   unpark, fresh map  read_snapshot after close_snapshot(): open + mmap + register + copy,
//                      what a new process does on a release-mode resume
//   prepare            prepare_snapshot with no file yet (create + fallocate + map + register)
//   park after prepare the first write_snapshot after prepare_snapshot
// On --device cpu the "pinned" buffer is plain memory and copies are memcpy-backed.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include "state/state_registry.hpp"

using Clock = std::chrono::steady_clock;
using gpurun::rt::StateRegistry;

namespace {

struct Args {
  std::string device = "cuda";
  int64_t bytes = int64_t{4} << 30;
  int64_t tensors = 128;
  int repeats = 3;
  std::string path;
  std::string json;
  bool verify = true;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "offload_bench: %s\nusage: offload_bench [--device cpu|cuda] [--bytes N] "
               "[--tensors K] [--repeats R] [--path FILE] [--json FILE] [--no-verify]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage(f + " needs a value");
      return argv[++i];
    };
    try {
      if (f == "--device") {
        a.device = next();
      } else if (f == "--bytes") {
        a.bytes = std::stoll(next());
      } else if (f == "--tensors") {
        a.tensors = std::stoll(next());
      } else if (f == "--repeats") {
        a.repeats = std::stoi(next());
      } else if (f == "--path") {
        a.path = next();
      } else if (f == "--json") {
        a.json = next();
      } else if (f == "--no-verify") {
        a.verify = false;
      } else {
        usage("unknown flag " + f);
      }
    } catch (const std::logic_error&) {
      usage("bad number after " + f);
    }
  }
  if (a.device != "cpu" && a.device != "cuda") usage("--device must be cpu or cuda");
  if (a.bytes < (int64_t{1} << 20) || a.tensors < 1 || a.repeats < 1)
    usage("--bytes must be at least 1 MiB, --tensors and --repeats at least 1");
  if (a.path.empty()) a.path = fmt::format("/dev/shm/gpurun-offload-bench.{}.snapshot", ::getpid());
  return a;
}

// The state: parameters only (their bytes are what moves; an optimizer's moments would be
// more tensors of the same kind).
struct State : torch::nn::Module {
  State(int64_t bytes, int64_t count, const at::Device& device) {
    constexpr int64_t kSmall = 4096;  // floats: 16 KiB, like a bias
    const int64_t big = std::max<int64_t>(1, (bytes / 4 - count * kSmall) / count);
    const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
    for (int64_t i = 0; i < count; ++i) {
      register_parameter(fmt::format("w{:04}", i), at::empty({big}, opts).fill_(0.5 + i));
      register_parameter(fmt::format("b{:04}", i), at::empty({kSmall}, opts).fill_(-1.0 - i));
    }
  }
};

struct Row {
  std::string name;
  double seconds = 0;
  int64_t bytes = 0;
  double ceiling_gbps = 0;  // 0: no ratio
  std::string notes;
  StateRegistry::SnapshotStats stats;
  bool has_stats = false;

  double gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
  double ratio() const { return ceiling_gbps > 0 ? gbps() / ceiling_gbps : 0; }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

struct Bench {
  Args args;
  at::Device device;
  bool cuda;

  explicit Bench(Args a)
      : args(std::move(a)),
        device(args.device == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU)),
        cuda(device.is_cuda()) {}

  void sync() const {
    if (cuda) torch::cuda::synchronize();
  }

  // Seconds of f(), device work included.
  double timed(const std::function<void()>& f) const {
    sync();
    const auto t0 = Clock::now();
    f();
    sync();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

  at::Tensor host_buffer(int64_t bytes) const {
    return at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(cuda));
  }
};

std::string stats_note(const StateRegistry::SnapshotStats& s) {
  return fmt::format("total {:.3f} s: setup {:.3f} s, register {:.3f} s, copy {:.3f} s{}{}{}",
                     s.total_seconds, s.setup_seconds, s.pin_seconds, s.copy_seconds,
                     s.created ? ", created" : "", s.mapped ? ", mapped" : "",
                     s.pinned ? ", pinned" : ", NOT pinned");
}

void write_json(const std::string& path, const Args& args, int64_t state_bytes, size_t tensor_count,
                double d2h, double h2d, const std::vector<Row>& rows, bool verified,
                bool target_met) {
  std::string out = "{\n";
  out += fmt::format(
      "  \"bench\": \"offload\",\n  \"device\": \"{}\",\n  \"state_bytes\": {},\n  "
      "\"tensors\": {},\n  \"repeats\": {},\n  \"snapshot_path\": \"{}\",\n  "
      "\"ceiling_d2h_gbps\": {:.4f},\n  \"ceiling_h2d_gbps\": {:.4f},\n  \"verified\": {},\n  "
      "\"target_met\": {},\n  \"rows\": [\n",
      args.device, state_bytes, tensor_count, args.repeats, args.path, d2h, h2d, verified,
      target_met);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    out += fmt::format(
        "    {{\"name\": \"{}\", \"seconds\": {:.6f}, \"bytes\": {}, \"gbps\": {:.4f}, "
        "\"ratio_to_ceiling\": {:.4f}",
        r.name, r.seconds, r.bytes, r.gbps(), r.ratio());
    if (r.has_stats) {
      const auto& s = r.stats;
      out += fmt::format(
          ", \"setup_s\": {:.6f}, \"register_s\": {:.6f}, \"copy_s\": {:.6f}, \"total_s\": "
          "{:.6f}, \"file_bytes\": {}, \"created\": {}, \"mapped\": {}, \"pinned\": {}",
          s.setup_seconds, s.pin_seconds, s.copy_seconds, s.total_seconds, s.file_bytes, s.created,
          s.mapped, s.pinned);
    }
    out += i + 1 < rows.size() ? "},\n" : "}\n";
  }
  out += "  ]\n}\n";
  std::ofstream f(path, std::ios::trunc);
  f << out;
  if (!f) throw std::runtime_error("offload_bench: cannot write " + path);
}

int run(const Args& args) {
  Bench b(args);
  if (b.cuda && !torch::cuda::is_available()) {
    std::fprintf(stderr, "offload_bench: --device cuda but LibTorch sees no CUDA device\n");
    return 2;
  }
  std::filesystem::remove(args.path);
  torch::NoGradGuard no_grad;

  State state(args.bytes, args.tensors, b.device);
  StateRegistry reg;
  reg.track_module(state, "model");
  const int64_t bytes = reg.nbytes();
  const std::vector<at::Tensor> ts = reg.tensors();
  const uint64_t checksum = args.verify ? reg.checksum() : 0;
  std::vector<Row> rows;

  // ---- ceiling: a pinned host buffer allocated once; one copy, and one copy per tensor ----
  double d2h_ceiling = 0, h2d_ceiling = 0;
  {
    at::Tensor host = b.host_buffer(bytes);
    std::vector<at::Tensor> slices;  // the per-tensor host views, like the snapshot's
    int64_t offset = 0;
    for (const at::Tensor& t : ts) {
      const auto n = static_cast<int64_t>(t.nbytes());
      slices.push_back(host.narrow(0, offset, n).view(t.scalar_type()).view(t.sizes()));
      offset += n;
    }
    std::vector<double> one_d2h, one_h2d, each_d2h, each_h2d;
    {
      at::Tensor flat = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(b.device));
      flat.fill_(7);
      host.copy_(flat);  // warm-up: first touch of every page, lazy CUDA init
      for (int r = 0; r < args.repeats; ++r) {
        one_d2h.push_back(b.timed([&] { host.copy_(flat, /*non_blocking=*/b.cuda); }));
        one_h2d.push_back(b.timed([&] { flat.copy_(host, /*non_blocking=*/b.cuda); }));
      }
    }
    for (int r = 0; r < args.repeats; ++r) {
      each_d2h.push_back(b.timed([&] {
        for (size_t i = 0; i < ts.size(); ++i) slices[i].copy_(ts[i], /*non_blocking=*/b.cuda);
      }));
      each_h2d.push_back(b.timed([&] {
        for (size_t i = 0; i < ts.size(); ++i) ts[i].copy_(slices[i], /*non_blocking=*/b.cuda);
      }));
    }
    const auto ceiling_row = [&](const std::string& name, double s) {
      Row r;
      r.name = name;
      r.seconds = s;
      r.bytes = bytes;
      rows.push_back(r);
      return r.gbps();
    };
    const double one_d = ceiling_row("ceiling D2H, one copy", median(one_d2h));
    const double one_h = ceiling_row("ceiling H2D, one copy", median(one_h2d));
    const double each_d = ceiling_row("ceiling D2H, per tensor", median(each_d2h));
    const double each_h = ceiling_row("ceiling H2D, per tensor", median(each_h2d));
    d2h_ceiling = std::max(one_d, each_d);
    h2d_ceiling = std::max(one_h, each_h);
  }  // the pinned buffer is freed before the snapshot rows

  const auto add = [&](const std::string& name, double seconds, double ceiling,
                       const StateRegistry::SnapshotStats& s) {
    Row r{name, seconds, s.tensor_bytes > 0 ? s.tensor_bytes : bytes, ceiling, stats_note(s),
          s,    true};
    rows.push_back(r);
    return r;
  };

  // ---- first park: no file yet ----
  {
    const double s = b.timed([&] { reg.write_snapshot(args.path); });
    add("first park (create+map+register+copy)", s, d2h_ceiling, reg.last_snapshot_stats());
  }
  // ---- hold mode: unpark from the kept mapping, park into it again ----
  std::vector<double> parks, unparks;
  StateRegistry::SnapshotStats park_stats, unpark_stats;
  for (int r = 0; r < args.repeats; ++r) {
    reg.release();
    unparks.push_back(b.timed([&] { reg.read_snapshot(args.path, b.device); }));
    unpark_stats = reg.last_snapshot_stats();
    parks.push_back(b.timed([&] { reg.write_snapshot(args.path); }));
    park_stats = reg.last_snapshot_stats();
  }
  add("park, repeated (kept file)", median(parks), d2h_ceiling, park_stats);
  add("unpark, kept mapping", median(unparks), h2d_ceiling, unpark_stats);
  // ---- release-mode resume: a fresh mapping of the populated file ----
  {
    reg.close_snapshot();
    reg.release();
    const double s = b.timed([&] { reg.read_snapshot(args.path, b.device); });
    add("unpark, fresh mapping (map+register+copy)", s, h2d_ceiling, reg.last_snapshot_stats());
  }
  const bool verified = !args.verify || reg.checksum() == checksum;
  // ---- prepared ahead: the first park only copies ----
  {
    reg.close_snapshot();
    std::filesystem::remove(args.path);
    const double prep = b.timed([&] { reg.prepare_snapshot(args.path); });
    add("prepare_snapshot (create+map+register)", prep, 0, reg.last_snapshot_stats());
    rows.back().bytes = reg.last_snapshot_stats().file_bytes;
    const double s = b.timed([&] { reg.write_snapshot(args.path); });
    add("first park after prepare", s, d2h_ceiling, reg.last_snapshot_stats());
  }
  reg.close_snapshot();
  std::filesystem::remove(args.path);

  const auto ratio_of = [&](const std::string& name) {
    for (const Row& r : rows)
      if (r.name == name) return r.ratio();
    return 0.0;
  };
  const bool target_met = ratio_of("park, repeated (kept file)") >= 0.8 &&
                          ratio_of("unpark, kept mapping") >= 0.8 &&
                          ratio_of("first park after prepare") >= 0.8;

  fmt::print("offload_bench: device {}, state {:.2f} GiB ({} bytes) in {} tensors, snapshot {}\n",
             args.device, bytes / double(int64_t{1} << 30), bytes, ts.size(), args.path);
  fmt::print("| {:<42} | {:>9} | {:>8} | {:>8} | {:>9} | {}\n", "measurement", "seconds", "GB/s",
             "ratio", "copy GB/s", "notes");
  fmt::print("|{:-<44}|{:-<11}|{:-<10}|{:-<10}|{:-<11}|------\n", "", "", "", "", "");
  for (const Row& r : rows) {
    const bool copied = r.has_stats && r.stats.copy_seconds > 0;
    fmt::print("| {:<42} | {:>9.4f} | {:>8.2f} | {:>8} | {:>9} | {}\n", r.name, r.seconds, r.gbps(),
               r.ceiling_gbps > 0 ? fmt::format("{:.0f} %", 100 * r.ratio()) : std::string("-"),
               copied ? fmt::format("{:.2f}", r.stats.tensor_bytes / r.stats.copy_seconds / 1e9)
                      : std::string("-"),
               r.notes);
  }
  fmt::print(
      "ceiling: D2H {:.2f} GB/s, H2D {:.2f} GB/s; state after the cycles {}; target (repeated "
      "park, kept unpark, park after prepare >= 80 % of ceiling): {}\n",
      d2h_ceiling, h2d_ceiling,
      args.verify ? (verified ? "bitwise equal" : "DIFFERS") : "unchecked",
      target_met ? "met" : "NOT met");
  if (!args.json.empty())
    write_json(args.json, args, bytes, ts.size(), d2h_ceiling, h2d_ceiling, rows, verified,
               target_met);
  return verified ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::filesystem::remove(args.path);
    std::fprintf(stderr, "offload_bench: %s\n", e.what());
    return 1;
  }
}
