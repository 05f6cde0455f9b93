// libFuzzer target: the request decoder on arbitrary bytes, fed in the chunk
// sizes the first input bytes pick. Checks that decoding never crashes, never
// exceeds the limits, and that re-encoding a decoded request decodes again to
// the same request. Build: -DGPURUN_BUILD_FUZZERS=ON with clang.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include "gpurun/store/frame_codec.hpp"

using gpurun::store::FrameDecoder;
using gpurun::store::Limits;
using gpurun::store::Request;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  // Small limits so the fuzzer reaches them; chunk size from the first byte.
  Limits limits;
  limits.max_key_bytes = 64;
  limits.max_value_bytes = 256;
  limits.max_keys_per_request = 16;
  const bool handshake = (data[0] & 0x80) != 0;
  const std::size_t chunk = (data[0] & 0x7F) + 1;
  FrameDecoder dec(limits, handshake);
  FrameDecoder again(limits, false);
  std::span<const uint8_t> rest(data + 1, size - 1);
  while (!rest.empty()) {
    std::span<const uint8_t> in = rest.first(std::min(chunk, rest.size()));
    rest = rest.subspan(in.size());
    for (;;) {
      Request r;
      const auto status = dec.decode(in, r);
      if (status == FrameDecoder::Status::kError) {
        check(!dec.error().empty());
        return 0;
      }
      if (status == FrameDecoder::Status::kNeedMore) {
        check(in.empty());
        break;
      }
      check(r.keys.size() <= limits.max_keys_per_request || r.keys.size() == 1);
      for (const auto& k : r.keys) check(k.size() <= limits.max_key_bytes);
      for (const auto& v : r.values) check(v.size() <= limits.max_value_bytes);
      std::string wire;
      gpurun::store::encode_request(r, wire);
      std::span<const uint8_t> w(reinterpret_cast<const uint8_t*>(wire.data()), wire.size());
      Request r2;
      check(again.decode(w, r2) == FrameDecoder::Status::kRequest);
      check(w.empty() && r2 == r);
    }
  }
  return 0;
}
