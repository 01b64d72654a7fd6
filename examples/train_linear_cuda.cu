// train_linear_cuda: a native CUDA trainer on ddprun's nccl backend, what llm.c-style programs
// hand-roll today (NCCL id over MPI or files and sleep, a flat all-reduce): one call connects
// the group from ddprun's environment, the Reducer averages gradients in buckets on a stream.
//
//   ddprun --nproc_per_node=gpu build/examples/train_linear_cuda --steps 200
//
// Model: linear regression y = X w + b on synthetic data (generated on the device from a fixed
// seed, the same on every rank); each rank takes its share of every global batch. Prints
// RESULT rank=R world=W loss=L checksum=C like train_mlp. Needs a GPU per rank.

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ddprun/common/error.hpp"
#include "ddprun/runtime/env.hpp"
#include "ddprun/runtime/process_group.hpp"
#include "ddprun/runtime/reducer.hpp"

using namespace ddprun::runtime;

namespace {

constexpr int kDim = 256;
constexpr int kDataset = 1 << 16;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw ddprun::Error(std::string(what) + ": " + cudaGetErrorString(e));
}

__device__ float hash_uniform(unsigned x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return (x & 0xffffff) / 16777216.0f - 0.5f;
}

// x[s][j] uniform, y[s] = x[s] . w_true + 0.1
__global__ void make_data(float* x, float* y, int n) {
  int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= n) return;
  float acc = 0.1f;
  for (int j = 0; j < kDim; ++j) {
    float v = hash_uniform(static_cast<unsigned>(s * kDim + j));
    x[s * kDim + j] = v;
    acc += v * hash_uniform(1000003u + static_cast<unsigned>(j));
  }
  y[s] = acc;
}

// err[b] = x[first + b] . w + bias - y
__global__ void forward(const float* x, const float* y, const float* w, const float* bias, float* err, int first, int batch) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  int s = first + b;
  float acc = bias[0];
  for (int j = 0; j < kDim; ++j) acc += x[s * kDim + j] * w[j];
  err[b] = acc - y[s];
}

// dw[j] = 2/B sum_b err[b] x[b][j]; db = 2/B sum_b err[b]
__global__ void backward(const float* x, const float* err, float* dw, float* db, int first, int batch) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j > kDim) return;
  float acc = 0;
  for (int b = 0; b < batch; ++b) acc += err[b] * (j == kDim ? 1.0f : x[(first + b) * kDim + j]);
  acc *= 2.0f / static_cast<float>(batch);
  if (j == kDim) {
    db[0] = acc;
  } else {
    dw[j] = acc;
  }
}

__global__ void sgd(float* p, const float* g, float lr, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] -= lr * g[i];
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 200, global_batch = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--steps") steps = std::atoi(argv[i + 1]);
    else if (k == "--global_batch") global_batch = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: train_linear_cuda [--steps N] [--global_batch B]\n");
      return 2;
    }
  }
  try {
    auto env = DistEnv::from_environment();
    auto pg = init_process_group("nccl", env);  // picks the device from LOCAL_RANK
    const int world = pg->size(), rank = pg->rank(), batch = global_batch / world;
    cudaStream_t stream;
    check(cudaStreamCreate(&stream), "cudaStreamCreate");
    pg->set_compute_stream(stream);

    float *x, *y, *w, *bias, *err;
    check(cudaMalloc(&x, sizeof(float) * kDataset * kDim), "cudaMalloc");
    check(cudaMalloc(&y, sizeof(float) * kDataset), "cudaMalloc");
    check(cudaMalloc(&w, sizeof(float) * kDim), "cudaMalloc");
    check(cudaMalloc(&bias, sizeof(float)), "cudaMalloc");
    check(cudaMalloc(&err, sizeof(float) * batch), "cudaMalloc");
    check(cudaMemsetAsync(w, 0, sizeof(float) * kDim, stream), "cudaMemset");
    check(cudaMemsetAsync(bias, 0, sizeof(float), stream), "cudaMemset");
    make_data<<<(kDataset + 255) / 256, 256, 0, stream>>>(x, y, kDataset);

    Reducer reducer(pg, {{kDim}, {1}});  // gradients of w and bias, in device memory
    float loss = 0;
    std::vector<float> host_err(batch);
    for (int step = 0; step < steps; ++step) {
      int first = ((step * global_batch) % kDataset) + rank * batch;
      forward<<<(batch + 127) / 128, 128, 0, stream>>>(x, y, w, bias, err, first, batch);
      backward<<<(kDim + 1 + 127) / 128, 128, 0, stream>>>(x, err, reducer.grad_as<float>(0), reducer.grad_as<float>(1),
                                                         first, batch);
      reducer.mark_ready(1);
      reducer.mark_ready(0);
      reducer.finalize();  // averaged gradients, ordered after the backward kernel on `stream`
      sgd<<<(kDim + 127) / 128, 128, 0, stream>>>(w, reducer.grad_as<float>(0), 0.5f, kDim);
      sgd<<<1, 1, 0, stream>>>(bias, reducer.grad_as<float>(1), 0.5f, 1);
      if (step == steps - 1) {
        check(cudaMemcpyAsync(host_err.data(), err, sizeof(float) * batch, cudaMemcpyDeviceToHost, stream), "cudaMemcpy");
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        for (float e : host_err) loss += e * e / static_cast<float>(batch);
      }
    }
    std::vector<float> hw(kDim);
    check(cudaMemcpy(hw.data(), w, sizeof(float) * kDim, cudaMemcpyDeviceToHost), "cudaMemcpy");
    double checksum = 0;
    for (int j = 0; j < kDim; ++j) checksum += hw[j] * (1 + j % 7);
    std::printf("RESULT rank=%d world=%d loss=%.6f checksum=%.9f\n", rank, world, loss, checksum);
    return 0;
  } catch (const ddprun::Error& e) {
    std::fprintf(stderr, "train_linear_cuda: %s\n", e.what());
    return 1;
  }
}
