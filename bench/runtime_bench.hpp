#pragma once
// Shared by runtime_bench's modes.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace ddprun::bench {

using Clock = std::chrono::steady_clock;

inline double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Args {
  std::string mode;
  std::string backend = "gloo";  // cost: fake | nccl | gloo
  double compute_ms = 0;
  bool compute_sleep = false;    // --compute sleep
  double bucket_cap_mb = 0;      // 0: the Reducer's default
  std::size_t count = 257;       // cost: floats per collective
  int iters = 2000;              // cost: collectives per measurement
};

int collective_cost(const Args& args);

}  // namespace ddprun::bench
