// train_linear_cuda: a native CUDA trainer on ddprun's nccl backend, what llm.c-style programs
// hand-roll today (NCCL id over MPI or files and sleep, a flat all-reduce): one call connects
// the group from ddprun's environment, the Reducer averages gradients in buckets on the group's
// stream, ordered after the trainer's own (non-blocking) stream.
//
//   ddprun --nproc_per_node=gpu build/examples/train_linear_cuda --steps 200
//
// Model: linear regression y = X w + b on synthetic data (generated on the device from a fixed
// seed, the same on every rank); each rank takes its share of every global batch, so 1, 2 and 4
// ranks train the same parameters. Prints RESULT rank=R world=W loss=L checksum=C step_us=U
// (host time per step) and checks what it can: the loss fell by 100x, and every rank ends with
// the same parameters (exit 1 otherwise).
//
// Faults, for scripts/gpu_check.sh: --fault kill|exit|stall --fault_step K makes the last rank
// SIGKILL itself, exit 3, or stop (a stalled peer) at step K of the first attempt.

#include <cuda_runtime_api.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
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

struct Args {
  int steps = 200;
  int global_batch = 256;
  double timeout_s = 300;
  std::string fault;  // kill | exit | stall
  int fault_step = -1;
};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CudaError(std::string(what) + ": " + cudaGetErrorString(e));
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

// dw[j] += 2/B sum_b err[b] x[b][j]; db += 2/B sum_b err[b] (zero_grad clears them each step)
__global__ void backward(const float* x, const float* err, float* dw, float* db, int first, int batch) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j > kDim) return;
  float acc = 0;
  for (int b = 0; b < batch; ++b) acc += err[b] * (j == kDim ? 1.0f : x[(first + b) * kDim + j]);
  acc *= 2.0f / static_cast<float>(batch);
  if (j == kDim) {
    db[0] += acc;
  } else {
    dw[j] += acc;
  }
}

__global__ void sgd(float* p, const float* g, float lr, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] -= lr * g[i];
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--steps") a.steps = std::atoi(v.c_str());
    else if (k == "--global_batch") a.global_batch = std::atoi(v.c_str());
    else if (k == "--timeout_s") a.timeout_s = std::atof(v.c_str());
    else if (k == "--fault") a.fault = v;
    else if (k == "--fault_step") a.fault_step = std::atoi(v.c_str());
    else throw ddprun::UsageError("unknown option " + k);
  }
  if (a.steps < 1 || a.global_batch < 1) throw ddprun::UsageError("--steps and --global_batch must be positive");
  return a;
}

void maybe_fault(const Args& a, int step, int rank, int world, int restart_count) {
  if (step != a.fault_step || restart_count != 0 || rank != world - 1 || a.fault.empty()) return;
  std::fprintf(stderr, "rank %d: --fault %s at step %d\n", rank, a.fault.c_str(), step);
  if (a.fault == "kill") ::raise(SIGKILL);
  if (a.fault == "exit") std::_Exit(3);
  if (a.fault == "stall") {
    for (;;) ::pause();  // a peer that stops answering: only the others' time-out ends the job
  }
}

float mean_square(const std::vector<float>& e) {
  double s = 0;
  for (float v : e) s += static_cast<double>(v) * v;
  return static_cast<float>(s / static_cast<double>(e.size()));
}

struct Result {
  float first_loss = 0, last_loss = 0;
  double checksum = 0, step_us = 0;
};

Result train(const Args& a, const DistEnv& env, const std::shared_ptr<ProcessGroup>& pg, cudaStream_t stream) {
  const int world = pg->size(), rank = pg->rank(), batch = a.global_batch / world;
  float *x, *y, *w, *bias, *err;
  check(cudaMalloc(&x, sizeof(float) * kDataset * kDim), "cudaMalloc");
  check(cudaMalloc(&y, sizeof(float) * kDataset), "cudaMalloc");
  check(cudaMalloc(&w, sizeof(float) * kDim), "cudaMalloc");
  check(cudaMalloc(&bias, sizeof(float)), "cudaMalloc");
  check(cudaMalloc(&err, sizeof(float) * batch), "cudaMalloc");
  check(cudaMemsetAsync(w, 0, sizeof(float) * kDim, stream), "cudaMemsetAsync");
  check(cudaMemsetAsync(bias, 0, sizeof(float), stream), "cudaMemsetAsync");
  make_data<<<(kDataset + 255) / 256, 256, 0, stream>>>(x, y, kDataset);

  Reducer reducer(pg, {{kDim}, {1}});  // gradients of w and bias, in device memory
  Result r;
  std::vector<float> host_err(batch);
  auto loss_now = [&] {
    check(cudaMemcpyAsync(host_err.data(), err, sizeof(float) * batch, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return mean_square(host_err);
  };
  const int timed_from = std::min(10, a.steps - 1);
  auto t0 = std::chrono::steady_clock::now();
  for (int step = 0; step < a.steps; ++step) {
    if (step == timed_from) t0 = std::chrono::steady_clock::now();
    maybe_fault(a, step, rank, world, env.restart_count);
    int first = ((step * a.global_batch) % kDataset) + rank * batch;
    reducer.zero_grad();
    forward<<<(batch + 127) / 128, 128, 0, stream>>>(x, y, w, bias, err, first, batch);
    if (step == 0) r.first_loss = loss_now();
    backward<<<(kDim + 1 + 127) / 128, 128, 0, stream>>>(x, err, reducer.grad_as<float>(0), reducer.grad_as<float>(1),
                                                       first, batch);
    reducer.mark_ready(1);
    reducer.mark_ready(0);
    reducer.finalize();  // averaged gradients, ordered after the backward kernel on `stream`
    sgd<<<(kDim + 127) / 128, 128, 0, stream>>>(w, reducer.grad_as<float>(0), 0.5f, kDim);
    sgd<<<1, 1, 0, stream>>>(bias, reducer.grad_as<float>(1), 0.5f, 1);
  }
  r.step_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
              std::max(1, a.steps - timed_from);
  r.last_loss = loss_now();
  std::vector<float> hw(kDim);
  check(cudaMemcpyAsync(hw.data(), w, sizeof(float) * kDim, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  for (int j = 0; j < kDim; ++j) r.checksum += hw[j] * (1 + j % 7);
  for (float* p : {x, y, w, bias, err}) cudaFree(p);
  return r;
}

// Every rank must end with the same parameters: the checksum's minimum and maximum over ranks.
bool same_on_every_rank(ProcessGroup& pg, double checksum) {
  double v[2] = {checksum, -checksum};
  void* d = pg.allocate(sizeof v);
  pg.copy_to_device(d, v, sizeof v);
  pg.all_reduce(d, 2, DataType::kFloat64, ReduceOp::kMax);
  pg.copy_to_host(v, d, sizeof v);
  pg.deallocate(d);
  return v[0] == -v[1];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a = parse(argc, argv);
    auto env = DistEnv::from_environment();
    ProcessGroupOptions opt;
    opt.timeout = std::chrono::milliseconds(static_cast<long long>(a.timeout_s * 1000));
    auto pg = init_process_group("nccl", env, opt);  // picks the device from LOCAL_RANK
    cudaStream_t stream;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    pg->set_compute_stream(stream);
    Result r = train(a, env, pg, stream);
    bool same = same_on_every_rank(*pg, r.checksum);
    std::printf("RESULT rank=%d world=%d loss=%.6f checksum=%.9f step_us=%.1f\n", pg->rank(), pg->size(), r.last_loss,
                r.checksum, r.step_us);
    std::fflush(stdout);
    if (!(r.last_loss < r.first_loss / 100) || !std::isfinite(r.checksum)) {
      std::fprintf(stderr, "train_linear_cuda: did not converge (loss %g -> %g)\n", r.first_loss, r.last_loss);
      return 1;
    }
    if (!same) {
      std::fprintf(stderr, "train_linear_cuda: the ranks ended with different parameters\n");
      return 1;
    }
    return 0;
  } catch (const ddprun::Error& e) {
    std::fprintf(stderr, "train_linear_cuda: %s\n", e.what());
    return ddprun::exit_code_for(e);
  }
}
