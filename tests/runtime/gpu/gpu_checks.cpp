// What gpu_tests checks on a real GPU: every collective and dtype (float32 ops, bf16 and fp16
// all_reduce and reduce_scatter), the Reducer, the stream contract with a cudaStreamNonBlocking
// compute stream, use from a thread that never set a device, compression kernels, subgroups.

#include "gpu_checks.hpp"

#include <cuda_runtime_api.h>

#include <cmath>
#include <sstream>
#include <thread>

#include "ddprun/runtime/reducer.hpp"
#include "gpu_kernels.hpp"

namespace ddprun::test::gpu {

using namespace ddprun::runtime;
using Group = std::shared_ptr<ProcessGroup>;

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Device memory of the group holding `host`; freed with the object.
struct DeviceBuffer {
  ProcessGroup& g;
  void* p;
  std::size_t bytes;
  DeviceBuffer(ProcessGroup& g, const void* host, std::size_t bytes) : g(g), p(g.allocate(bytes)), bytes(bytes) {
    if (host) g.copy_to_device(p, host, bytes);
  }
  ~DeviceBuffer() { g.deallocate(p); }
  template <typename T>
  std::vector<T> read(std::size_t n) {
    std::vector<T> out(n);
    g.copy_to_host(out.data(), p, n * sizeof(T));
    return out;
  }
};

std::string f32_ops(const Group& pg) {
  const int n = pg->size(), r = pg->rank();
  const std::size_t count = 10 * 1000 * 1000;
  std::vector<float> host(count, static_cast<float>(r + 1));
  std::ostringstream bad;
  for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
    DeviceBuffer d(*pg, host.data(), count * sizeof(float));
    pg->all_reduce(d.p, count, DataType::kFloat32, op);
    float got = d.read<float>(count).back();
    float want = op == ReduceOp::kSum ? n * (n + 1) / 2.0f
                 : op == ReduceOp::kAvg ? (n + 1) / 2.0f
                 : op == ReduceOp::kMin ? 1.0f
                                        : static_cast<float>(n);
    if (std::abs(got - want) > 1e-5f) bad << name(op) << ": " << got << " != " << want << "; ";
  }
  return bad.str();
}

// Element i of rank r: small integers, so sums are exact in bf16 and fp16.
float small(int r, std::size_t i) { return static_cast<float>(r + 1 + static_cast<int>(i % 5)); }

std::string half_types(const Group& pg) {
  const int n = pg->size(), r = pg->rank();
  const std::size_t count = 4099;
  std::ostringstream bad;
  for (auto t : {DataType::kBFloat16, DataType::kFloat16}) {
    auto enc = [&](float v) { return t == DataType::kBFloat16 ? float_to_bfloat16(v) : float_to_half(v); };
    auto dec = [&](std::uint16_t v) { return t == DataType::kBFloat16 ? bfloat16_to_float(v) : half_to_float(v); };
    std::vector<std::uint16_t> mine(count * n);
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = enc(small(r, i));
    auto want = [&](std::size_t i, bool avg) {
      float s = 0;
      for (int k = 0; k < n; ++k) s += small(k, i);
      return avg ? s / n : s;
    };
    for (auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      DeviceBuffer d(*pg, mine.data(), count * 2);
      pg->all_reduce(d.p, count, t, op);
      auto got = d.read<std::uint16_t>(count);
      for (std::size_t i = 0; i < count; i += 7) {
        float w = want(i, op == ReduceOp::kAvg);
        if (std::abs(dec(got[i]) - w) > 1e-2f * std::abs(w)) {
          bad << name(t) << " all_reduce " << name(op) << " [" << i << "] " << dec(got[i]) << " != " << w << "; ";
          break;
        }
      }
    }
    DeviceBuffer in(*pg, mine.data(), mine.size() * 2), out(*pg, nullptr, count * 2);
    pg->reduce_scatter(in.p, out.p, count, t, ReduceOp::kSum);
    auto got = out.read<std::uint16_t>(count);
    for (std::size_t i = 0; i < count; i += 7) {
      float w = want(r * count + i, false);
      if (dec(got[i]) != w) {
        bad << name(t) << " reduce_scatter [" << i << "] " << dec(got[i]) << " != " << w << "; ";
        break;
      }
    }
  }
  return bad.str();
}

std::string reducer(const Group& pg) {
  const int n = pg->size(), r = pg->rank();
  Reducer red(pg, {{1000}, {300000}, {7}}, ReducerOptions{.broadcast_parameters = false});
  for (std::size_t k = 0; k < 3; ++k) {
    std::vector<float> g(k == 0 ? 1000 : k == 1 ? 300000 : 7, static_cast<float>(r));
    pg->copy_to_device(red.grad(k), g.data(), g.size() * sizeof(float));
  }
  for (std::size_t k = 3; k-- > 0;) red.mark_ready(k);
  red.finalize();
  float v = -1;
  pg->copy_to_host(&v, red.grad(1), sizeof(float));
  if (std::abs(v - (n - 1) / 2.0f) > 1e-5f) return "average " + std::to_string(v);
  pg->barrier();
  return "";
}

// The trainer's stream is cudaStreamNonBlocking (no implicit order with the legacy stream): a
// slow kernel writes the gradient, the Reducer averages it, a slow kernel copies the average
// out; then the gradient is written again, zero_grad(), and a kernel copies it out: 0.
std::string streams(const Group& pg) {
  const int n = pg->size(), r = pg->rank();
  cudaStream_t compute;
  cuda_check(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  pg->set_compute_stream(compute);
  const std::size_t count = 4096;
  std::string bad;
  {
    Reducer red(pg, {{count}}, ReducerOptions{.broadcast_parameters = false});
    DeviceBuffer out(*pg, nullptr, count * sizeof(float));
    auto* grad = red.grad_as<float>(0);
    slow_fill(grad, count, static_cast<float>(r + 1), 2000, compute);
    red.mark_ready(0);
    red.finalize();
    slow_copy(static_cast<float*>(out.p), grad, count, 2000, compute);
    cuda_check(cudaStreamSynchronize(compute), "cudaStreamSynchronize");
    float avg = out.read<float>(count).back();
    if (avg != (n + 1) / 2.0f) bad += "averaged gradient " + std::to_string(avg) + "; ";
    slow_fill(grad, count, 7.0f, 2000, compute);
    red.zero_grad();
    slow_copy(static_cast<float*>(out.p), grad, count, 0, compute);
    cuda_check(cudaStreamSynchronize(compute), "cudaStreamSynchronize");
    float zeroed = out.read<float>(count).front();
    if (zeroed != 0.0f) bad += "after zero_grad " + std::to_string(zeroed) + "; ";
  }
  pg->set_compute_stream(nullptr);
  cudaStreamDestroy(compute);
  return bad;
}

// A thread that never called cudaSetDevice (device 0) uses the group, which may be on another.
std::string other_thread(const Group& pg) {
  std::string bad;
  std::thread t([&] {
    try {
      bad = reducer(pg);
      int device = -1;
      cudaGetDevice(&device);
      if (device != 0) bad += "the thread's device changed to " + std::to_string(device) + "; ";
    } catch (const std::exception& e) {
      bad = e.what();
    }
  });
  t.join();
  return bad;
}

std::string compression(const Group& pg) {
  const int n = pg->size(), r = pg->rank();
  const std::size_t count = 100000;
  std::string bad;
  for (auto c : {Compression::kFloat16, Compression::kBFloat16}) {
    ReducerOptions o;
    o.compression = c;
    o.broadcast_parameters = false;
    Reducer red(pg, {{count}}, o);
    auto value = [](int k, std::size_t i) { return 1e-2f * std::sin(0.001f * static_cast<float>(i) * (k + 1)); };
    std::vector<float> g(count);
    for (std::size_t i = 0; i < count; ++i) g[i] = value(r, i);
    pg->copy_to_device(red.grad(0), g.data(), count * sizeof(float));
    red.mark_ready(0);
    red.finalize();
    pg->copy_to_host(g.data(), red.grad(0), count * sizeof(float));
    double max_err = 0, max_abs = 0;
    for (std::size_t i = 0; i < count; ++i) {
      double exact = 0;
      for (int k = 0; k < n; ++k) exact += value(k, i);
      exact /= n;
      max_abs = std::max(max_abs, std::abs(exact));
      max_err = std::max(max_err, std::abs(g[i] - exact));
    }
    double bound = (c == Compression::kFloat16 ? 1e-3 : 8e-3) * 2 * max_abs;
    if (!(max_err <= bound && max_err > 0)) {
      bad += std::string(c == Compression::kFloat16 ? "fp16" : "bf16") + " error " + std::to_string(max_err) + "; ";
    }
  }
  return bad;
}

std::string subgroups(const Group& pg) {
  const int n = pg->size(), r = pg->rank();
  auto pair = pg->split(r / 2, r);  // {0,1} {2,3} ...
  auto first = pg->new_group({0});
  float v = static_cast<float>(r + 1);
  DeviceBuffer d(*pair, &v, sizeof v);
  pair->all_reduce(d.p, 1, DataType::kFloat32, ReduceOp::kSum);
  float got = d.read<float>(1)[0];
  float want = 0;
  for (int k = (r / 2) * 2; k < std::min(n, (r / 2) * 2 + 2); ++k) want += static_cast<float>(k + 1);
  std::string bad;
  if (got != want) bad += "pair sum " + std::to_string(got) + " != " + std::to_string(want) + "; ";
  if ((first != nullptr) != (r == 0)) bad += "new_group({0}) membership; ";
  return bad;
}

}  // namespace

std::vector<Check> checks() {
  return {
      {"float32 all_reduce, every op, 10 M floats", f32_ops},
      {"bf16 and fp16 all_reduce (sum, avg) and reduce_scatter", half_types},
      {"Reducer on device memory", reducer},
      {"streams: a cudaStreamNonBlocking compute stream, Reducer step and zero_grad in order", streams},
      {"threads: the group used from a thread that never set a device", other_thread},
      {"compression: fp16 and bf16 buckets cast on the device", compression},
      {"subgroups: split and new_group (ncclCommSplit)", subgroups},
  };
}

}  // namespace ddprun::test::gpu
