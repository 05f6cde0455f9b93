// gpurun::rt::Trace — one JSON object per line per event of this rank (boundaries,
// handoffs, offloads), appended to <dir>/gpu<slot>.jsonl; what the integration tests and
// benchmarks read. Disabled (every call a no-op) without a directory.
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace gpurun::rt {

class Trace {
 public:
  Trace() = default;
  /// Opens <dir>/gpu<slot>.jsonl for appending (creates dir). Throws gpurun::Error naming the
  /// path when it cannot.
  Trace(const std::string& dir, int slot);
  ~Trace();
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;
  Trace(Trace&& o) noexcept : f_(std::exchange(o.f_, nullptr)) {}
  Trace& operator=(Trace&& o) noexcept;

  /// A field: name and already-JSON-encoded value (use num()/str()).
  using Field = std::pair<std::string, std::string>;
  static std::string num(double v);
  static std::string num(int64_t v);
  static std::string str(const std::string& v);
  static std::string ints(const std::vector<int>& v);

  /// Writes {"t_ms":<unix ms>,"event":...,fields...} and flushes (a leaver may exit right
  /// after).
  void write(const std::string& event, const std::vector<Field>& fields);
  bool enabled() const { return f_ != nullptr; }

 private:
  std::FILE* f_ = nullptr;
};

}  // namespace gpurun::rt
