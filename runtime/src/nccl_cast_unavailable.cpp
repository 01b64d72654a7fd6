// The cast kernel's stand-in in a build without a CUDA compiler (see nccl_cast.hpp).

#include "nccl_cast.hpp"

namespace ddprun::runtime::nccl {

Status launch_cast(const void*, DataType, void*, DataType, std::size_t, float, cudaStream_t) {
  return Status::error(
      "gradient compression on the device needs the cast kernel, and this build of ddprun has none (nvcc was not "
      "found when it was built)");
}

}  // namespace ddprun::runtime::nccl
