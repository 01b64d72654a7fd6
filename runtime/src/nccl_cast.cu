#include "nccl_cast.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

namespace ddprun::runtime::nccl {
namespace {

__device__ float to_float(float v) { return v; }
__device__ float to_float(__half v) { return __half2float(v); }
__device__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ T from_float(float v);
template <>
__device__ float from_float<float>(float v) { return v; }
template <>
__device__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename In, typename Out>
__global__ void cast_kernel(const In* in, Out* out, std::size_t n, float scale) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = from_float<Out>(to_float(in[i]) * scale);
  }
}

template <typename In, typename Out>
Status launch(const void* in, void* out, std::size_t n, float scale, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  constexpr unsigned kThreads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>((n + kThreads - 1) / kThreads, 4096));
  cast_kernel<In, Out><<<blocks, kThreads, 0, stream>>>(static_cast<const In*>(in), static_cast<Out*>(out), n, scale);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::ok();
  return Status::cuda_error(std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e));
}

}  // namespace

Status launch_cast(const void* in, DataType in_type, void* out, DataType out_type, std::size_t count, float scale,
                   cudaStream_t stream) {
  if (in_type == DataType::kFloat32 && out_type == DataType::kFloat16) return launch<float, __half>(in, out, count, scale, stream);
  if (in_type == DataType::kFloat32 && out_type == DataType::kBFloat16) {
    return launch<float, __nv_bfloat16>(in, out, count, scale, stream);
  }
  if (in_type == DataType::kFloat16 && out_type == DataType::kFloat32) return launch<__half, float>(in, out, count, scale, stream);
  if (in_type == DataType::kBFloat16 && out_type == DataType::kFloat32) {
    return launch<__nv_bfloat16, float>(in, out, count, scale, stream);
  }
  return Status::error(std::string("no cast kernel from ") + name(in_type) + " to " + name(out_type));
}

}  // namespace ddprun::runtime::nccl
