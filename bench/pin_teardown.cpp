// What a release-mode leaver's pause costs on the host side, outside gpurun: a 7.56 GB (ViT-H's
// state) /dev/shm mapping page-locked with cudaHostRegister, copied into from the device, then
// unregistered and unmapped — whole, as 8/16/32 pieces from as many threads, with
// MADV_HUGEPAGE — and the alternatives without a big page-locked mapping (a pinned bounce
// buffer with pwrite into the file, or memcpy into a prefaulted mapping). docs/results.md
// quotes its output (H200 machine, 2026-12-02). Not built by CMake (CUDA runtime only, no
// LibTorch); reads the GPU only:
//   g++ -std=c++20 -O2 -I/usr/local/cuda/include bench/pin_teardown.cpp -o /tmp/pin_teardown \
//       -L/usr/local/cuda/lib64 -lcudart -lpthread && /tmp/pin_teardown   (PB_MIB=… resizes)
// Needs 2 × the size free in /dev/shm and on the GPU.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern char** environ;
using Clock = std::chrono::steady_clock;
static double ms(Clock::time_point a) {
  return std::chrono::duration<double, std::milli>(Clock::now() - a).count();
}
static double mono_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
#define CK(x)                                                      \
  do {                                                             \
    cudaError_t e = (x);                                           \
    if (e != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); \
      std::exit(2);                                                \
    }                                                              \
  } while (0)

static size_t S = size_t(7560) << 20;

static int make_file(const char* p) {
  int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || posix_fallocate(fd, 0, S) != 0) {
    perror(p);
    std::exit(2);
  }
  return fd;
}
static long meminfo(const char* key) {
  FILE* f = fopen("/proc/meminfo", "r");
  char line[256];
  long v = -1;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, key, strlen(key))) v = atol(line + strlen(key) + 1);
  fclose(f);
  return v;
}

static void case_pinned(void* dev, bool huge) {
  const char* p = "/dev/shm/pinbench_a";
  int fd = make_file(p);
  auto t = Clock::now();
  uint8_t* m = (uint8_t*)mmap(nullptr, S, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (huge) madvise(m, S, MADV_HUGEPAGE);
  double t_map = ms(t);
  t = Clock::now();
  for (size_t i = 0; i < S; i += 4096) m[i] = 0;
  double t_touch = ms(t);
  long hp = meminfo("ShmemHugePages:");
  t = Clock::now();
  CK(cudaHostRegister(m, S, cudaHostRegisterPortable));
  double t_reg = ms(t);
  t = Clock::now();
  CK(cudaMemcpy(m, dev, S, cudaMemcpyDeviceToHost));
  double t_copy = ms(t);
  t = Clock::now();
  CK(cudaHostUnregister(m));
  double t_unreg = ms(t);
  t = Clock::now();
  munmap(m, S);
  close(fd);
  double t_unmap = ms(t);
  unlink(p);
  std::printf(
      "pinned%s: map %.0f touch %.0f (ShmemHugePages %ld kB) register %.0f copy %.0f (%.1f GB/s) "
      "unregister %.0f munmap %.0f ms\n",
      huge ? "+MADV_HUGEPAGE" : "", t_map, t_touch, hp, t_reg, t_copy, S / t_copy / 1e6, t_unreg,
      t_unmap);
}

// Bounce: T threads, each with 2 pinned staging buffers of C bytes and its own stream; chunk
// i goes to thread i % T; D2H into staging, then pwrite (or memcpy into a mapping).
static void case_bounce(void* dev, int T, size_t C, bool use_map) {
  const char* p = "/dev/shm/pinbench_b";
  int fd = make_file(p);
  uint8_t* m = nullptr;
  double t_pop = 0;
  if (use_map) {
    auto t = Clock::now();
    m = (uint8_t*)mmap(nullptr, S, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    t_pop = ms(t);
  }
  auto ta = Clock::now();
  std::vector<uint8_t*> bufs(2 * T);
  for (auto& b : bufs) CK(cudaHostAlloc((void**)&b, C, cudaHostAllocDefault));
  std::vector<cudaStream_t> streams(T);
  for (auto& s : streams) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  double t_alloc = ms(ta);
  const size_t chunks = (S + C - 1) / C;
  std::atomic<uint64_t> sink{0};
  auto t = Clock::now();
  std::vector<std::thread> th;
  for (int w = 0; w < T; ++w)
    th.emplace_back([&, w] {
      CK(cudaSetDevice(0));
      uint64_t acc = 0;
      int j = 0;
      std::vector<size_t> mine;
      for (size_t i = w; i < chunks; i += T) mine.push_back(i);
      auto issue = [&](size_t k, uint8_t* b) {
        size_t off = mine[k] * C, n = std::min(C, S - off);
        CK(cudaMemcpyAsync(b, (uint8_t*)dev + off, n, cudaMemcpyDeviceToHost, streams[w]));
      };
      if (mine.empty()) return;
      issue(0, bufs[2 * w]);
      for (size_t k = 0; k < mine.size(); ++k) {
        uint8_t* b = bufs[2 * w + (k & 1)];
        CK(cudaStreamSynchronize(streams[w]));
        if (k + 1 < mine.size()) issue(k + 1, bufs[2 * w + ((k + 1) & 1)]);
        size_t off = mine[k] * C, n = std::min(C, S - off);
        const uint64_t* q = (const uint64_t*)b;  // stand-in for the chunk hash: one read pass
        for (size_t x = 0; x < n / 8; ++x) acc += q[x] * (x | 1);
        if (use_map)
          std::memcpy(m + off, b, n);
        else if (pwrite(fd, b, n, off) != (ssize_t)n)
          std::abort();
        ++j;
      }
      sink += acc;
    });
  for (auto& x : th) x.join();
  double t_all = ms(t);
  t = Clock::now();
  for (auto& b : bufs) CK(cudaFreeHost(b));
  for (auto& s : streams) cudaStreamDestroy(s);
  double t_free = ms(t);
  double t_unmap = 0;
  if (use_map) {
    t = Clock::now();
    munmap(m, S);
    t_unmap = ms(t);
  }
  close(fd);
  unlink(p);
  std::printf(
      "bounce %s T=%d C=%zuMiB: populate %.0f alloc %.0f write+sum %.0f (%.1f GB/s) free %.0f "
      "munmap %.0f ms (%llu)\n",
      use_map ? "memcpy->map" : "pwrite", T, C >> 20, t_pop, t_alloc, t_all, S / t_all / 1e6,
      t_free, t_unmap, (unsigned long long)(sink.load() & 1));
}

// The file mapped as P separate mappings (pieces), each registered; then unregistered and
// unmapped from P threads at once (or serially).
static void case_pieces(void* dev, int P, bool parallel) {
  const char* p = "/dev/shm/pinbench_p";
  int fd = make_file(p);
  size_t piece = (S / P + 4095) / 4096 * 4096;
  std::vector<uint8_t*> m(P);
  std::vector<size_t> len(P);
  auto t = Clock::now();
  auto each = [&](auto fn) {
    if (!parallel) {
      for (int i = 0; i < P; ++i) fn(i);
      return;
    }
    std::vector<std::thread> th;
    for (int i = 0; i < P; ++i)
      th.emplace_back([&, i] {
        CK(cudaSetDevice(0));
        fn(i);
      });
    for (auto& x : th) x.join();
  };
  each([&](int i) {
    size_t off = size_t(i) * piece;
    len[i] = std::min(piece, S - off);
    m[i] = (uint8_t*)mmap(nullptr, len[i], PROT_READ | PROT_WRITE, MAP_SHARED, fd, off);
    CK(cudaHostRegister(m[i], len[i], cudaHostRegisterPortable));
  });
  double t_reg = ms(t);
  t = Clock::now();
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int i = 0; i < P; ++i)
    CK(cudaMemcpyAsync(m[i], (uint8_t*)dev + size_t(i) * piece, len[i], cudaMemcpyDeviceToHost,
                       st));
  CK(cudaStreamSynchronize(st));
  double t_copy = ms(t);
  t = Clock::now();
  each([&](int i) { CK(cudaHostUnregister(m[i])); });
  double t_unreg = ms(t);
  t = Clock::now();
  each([&](int i) { munmap(m[i], len[i]); });
  double t_unmap = ms(t);
  close(fd);
  unlink(p);
  std::printf(
      "pieces P=%d %s: map+register %.0f copy %.0f (%.1f GB/s) unregister %.0f munmap %.0f ms\n", P,
      parallel ? "parallel" : "serial", t_reg, t_copy, S / t_copy / 1e6, t_unreg, t_unmap);
}

// Child (argv: child plain|pinned|unreg|reset|_exit): device 2 GiB + optionally a pinned
// 7.5 GB mapping; prints mono ms, then leaves main. The parent (case_exit) measures printed ->
// reaped: what a process's end costs with and without the page-locked mapping.
static int child(const char* how) {
  void* d;
  CK(cudaMalloc(&d, size_t(2) << 30));
  CK(cudaMemset(d, 1, size_t(2) << 30));
  CK(cudaDeviceSynchronize());
  uint8_t* m = nullptr;
  int fd = -1;
  bool pin = strcmp(how, "plain") != 0;
  if (pin) {
    fd = make_file("/dev/shm/pinbench_c");
    m = (uint8_t*)mmap(nullptr, S, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CK(cudaHostRegister(m, S, cudaHostRegisterPortable));
    CK(cudaMemcpy(m, d, size_t(2) << 30, cudaMemcpyDeviceToHost));
  }
  CK(cudaFree(d));
  double u = 0, r = 0;
  if (!strcmp(how, "unreg")) {
    auto t = Clock::now();
    CK(cudaHostUnregister(m));
    munmap(m, S);
    u = ms(t);
  }
  if (!strcmp(how, "reset")) {
    auto t = Clock::now();
    cudaDeviceReset();
    r = ms(t);
  }
  std::printf("%.3f %.1f %.1f\n", mono_ms(), u, r);
  std::fflush(stdout);
  if (!strcmp(how, "_exit")) _exit(0);
  return 0;
}

static void case_exit(const char* self, const char* how) {
  int p[2];
  if (pipe(p) != 0) std::abort();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  char* argv[] = {(char*)self, (char*)"child", (char*)how, nullptr};
  pid_t pid;
  auto t0 = Clock::now();
  posix_spawn(&pid, self, &fa, nullptr, argv, environ);
  close(p[1]);
  char buf[128] = {};
  ssize_t n = read(p[0], buf, sizeof buf - 1);
  int st;
  waitpid(pid, &st, 0);
  double reaped = mono_ms();
  double life = ms(t0);
  close(p[0]);
  unlink("/dev/shm/pinbench_c");
  double t = 0, u = 0, r = 0;
  if (n > 0) sscanf(buf, "%lf %lf %lf", &t, &u, &r);
  std::printf(
      "exit %-6s: unregister+unmap %.0f reset %.0f, printed -> reaped %.0f ms (child life %.0f "
      "ms)\n",
      how, u, r, reaped - t, life);
}

int main(int argc, char** argv) {
  if (argc > 2 && !strcmp(argv[1], "child")) return child(argv[2]);
  if (const char* g = getenv("PB_MIB")) S = size_t(atol(g)) << 20;
  void* dev;
  CK(cudaMalloc(&dev, S));
  CK(cudaMemset(dev, 7, S));
  CK(cudaDeviceSynchronize());
  case_pinned(dev, false);
  case_pieces(dev, 1, false);
  case_pieces(dev, 16, false);
  case_pieces(dev, 16, true);
  case_pieces(dev, 8, true);
  case_pieces(dev, 32, true);
  case_pinned(dev, false);
  for (int T : {4, 8, 16}) case_bounce(dev, T, size_t(32) << 20, false);
  case_bounce(dev, 12, size_t(32) << 20, true);
  CK(cudaFree(dev));
  for (const char* how : {"plain", "pinned", "unreg", "reset", "_exit"}) case_exit(argv[0], how);
  return 0;
}
