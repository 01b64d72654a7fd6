#pragma once
// Shared by runtime_bench's modes.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/runtime/process_group.hpp"

namespace ddprun::bench {

using Clock = std::chrono::steady_clock;

inline double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Memory of the group (device memory on nccl) filled with `fill`; freed with the object.
class Buffer {
 public:
  Buffer(runtime::ProcessGroup& pg, std::size_t floats, float fill = 1.0f) : pg_(pg), p_(pg.allocate(floats * 4)) {
    std::vector<float> host(floats, fill);
    pg.copy_to_device(p_, host.data(), floats * 4);
  }
  ~Buffer() { pg_.deallocate(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* data() const { return static_cast<float*>(p_); }

 private:
  runtime::ProcessGroup& pg_;
  void* p_;
};

// Returns once the group's work issued so far is done: a 4-byte copy to the host, which on nccl
// waits for the group's stream (after the compute stream); on gloo a memcpy.
inline void settle(runtime::ProcessGroup& pg, const Buffer& b) {
  float x;
  pg.copy_to_host(&x, b.data(), sizeof x);
}

// The largest of every rank's v (the slowest rank bounds a collective).
inline double max_over_ranks(runtime::ProcessGroup& pg, double v) {
  void* d = pg.allocate(sizeof v);
  pg.copy_to_device(d, &v, sizeof v);
  pg.all_reduce(d, 1, runtime::DataType::kFloat64, runtime::ReduceOp::kMax);
  pg.copy_to_host(&v, d, sizeof v);
  pg.deallocate(d);
  return v;
}

struct Args {
  std::string mode;
  std::string backend = "gloo";  // gloo | nccl (cost: also fake)
  double compute_ms = 0;
  bool compute_sleep = false;    // --compute sleep
  double bucket_cap_mb = 0;      // 0: the Reducer's default
  std::size_t count = 257;       // cost: floats per collective
  int iters = 2000;              // cost: collectives per measurement
  double max_us = 0;             // cost: exit 1 when a collective costs more (0: no limit)
};

int collective_cost(const Args& args);
int resnet50(const std::shared_ptr<runtime::ProcessGroup>& pg, const Args& args);

}  // namespace ddprun::bench
