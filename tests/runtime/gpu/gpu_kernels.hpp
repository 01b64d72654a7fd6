#pragma once
// Kernels the GPU tests queue on a trainer's compute stream (gpu_kernels.cu).

#include <cstddef>

#include <cuda_runtime_api.h>

namespace ddprun::test::gpu {

// After spinning about `spin_us` on the device (so that a missing ordering shows), sets
// p[0..n) to `value`.
void slow_fill(float* p, std::size_t n, float value, unsigned spin_us, cudaStream_t stream);
// dst[0..n) = src[0..n), after spinning about `spin_us`.
void slow_copy(float* dst, const float* src, std::size_t n, unsigned spin_us, cudaStream_t stream);

}  // namespace ddprun::test::gpu
