#include "gpu_kernels.hpp"

namespace ddprun::test::gpu {
namespace {

__device__ void spin(unsigned spin_us) {
  // %globaltimer counts nanoseconds.
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < 1000ull * spin_us);
}

__global__ void slow_fill_kernel(float* p, std::size_t n, float value, unsigned spin_us) {
  if (threadIdx.x == 0 && blockIdx.x == 0) spin(spin_us);
  __syncthreads();
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) p[i] = value;
}

__global__ void slow_copy_kernel(float* dst, const float* src, std::size_t n, unsigned spin_us) {
  if (threadIdx.x == 0 && blockIdx.x == 0) spin(spin_us);
  __syncthreads();
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

void slow_fill(float* p, std::size_t n, float value, unsigned spin_us, cudaStream_t stream) {
  slow_fill_kernel<<<1, 256, 0, stream>>>(p, n, value, spin_us);
}

void slow_copy(float* dst, const float* src, std::size_t n, unsigned spin_us, cudaStream_t stream) {
  slow_copy_kernel<<<1, 256, 0, stream>>>(dst, src, n, spin_us);
}

}  // namespace ddprun::test::gpu
