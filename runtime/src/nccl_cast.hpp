#pragma once
// The cast kernel of the nccl backend's gradient compression (private): float32 <-> float16 /
// bfloat16 with a scale, on a stream. nccl_cast.cu (nvcc); nccl_cast_unavailable.cpp in a build
// without a CUDA compiler.

#include <cstddef>

#include <cuda_runtime_api.h>

#include "nccl_api.hpp"

namespace ddprun::runtime::nccl {

// out[i] = (out_type)((float)in[i] * scale); returns the launch's status.
Status launch_cast(const void* in, DataType in_type, void* out, DataType out_type, std::size_t count, float scale,
                   cudaStream_t stream);

}  // namespace ddprun::runtime::nccl
