// Backend names and the factory that picks the communicator compiled into this build.
#include "comm/communicator.hpp"

#include <fmt/format.h>

#if GPURUN_HAVE_GLOO
#include "comm/gloo/communicator.hpp"
#endif
#if GPURUN_HAVE_NCCL
#include "comm/nccl/communicator.hpp"
#endif

namespace gpurun::rt {

const char* to_string(CommBackend b) {
  switch (b) {
    case CommBackend::kGloo:
      return "gloo";
    case CommBackend::kNccl:
      return "nccl";
  }
  return "unknown";
}

bool comm_backend_available(CommBackend b) {
  switch (b) {
    case CommBackend::kGloo:
      return GPURUN_HAVE_GLOO != 0;
    case CommBackend::kNccl:
      return GPURUN_HAVE_NCCL != 0;
  }
  return false;
}

std::unique_ptr<Communicator> make_communicator(CommBackend backend, const CommOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    throw Error(
        fmt::format("cannot create a {} communicator for group '{}': rank {} is not in "
                    "[0, {}) (size must be >= 1)",
                    to_string(backend), options.prefix, options.rank, options.size));
  }
  if (options.prefix.empty()) {
    throw Error(
        fmt::format("cannot create a {} communicator (rank {} of {}): the rendezvous "
                    "prefix is empty; give each group and generation its own prefix",
                    to_string(backend), options.rank, options.size));
  }
  switch (backend) {
    case CommBackend::kGloo:
#if GPURUN_HAVE_GLOO
      return make_gloo_communicator(options);
#else
      throw Error(
          "the Gloo communicator is not built in: rebuild gpurun with Gloo (Debian: install "
          "libgloo-dev, then configure with -DGPURUN_WITH_GLOO=ON)");
#endif
    case CommBackend::kNccl:
#if GPURUN_HAVE_NCCL
      return make_nccl_communicator(options);
#else
      throw Error(
          "the NCCL communicator is not built in: rebuild gpurun against a CUDA LibTorch with "
          "-DGPURUN_WITH_CUDA=ON (needs the CUDA toolkit and NCCL)");
#endif
  }
  throw Error(fmt::format("unknown communicator backend {}", static_cast<int>(backend)));
}

}  // namespace gpurun::rt
