// A worker for the runtime's multi-process tests, run under ddprun.
//   runtime_worker collectives   every collective, dtype and op across processes; exit 0 if right
//   runtime_worker peer_dies     rank 1 exits after the group forms; rank 0's all_reduce must fail
//                                within its time-out; prints "error after S s: MESSAGE", exits 3
//   runtime_worker sampler N W R S E D   print DistributedSampler(N, W, R, shuffle=S, seed, drop_last=D)
//                                indices for epoch E (no group, no launcher needed)

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ddprun/common/error.hpp"
#include "ddprun/runtime/env.hpp"
#include "ddprun/runtime/process_group.hpp"
#include "ddprun/runtime/sampler.hpp"

using namespace ddprun::runtime;

int collectives() {
  auto pg = init_process_group("gloo");
  int r = pg->rank(), n = pg->size();
  for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
    std::vector<double> d(1009);
    std::vector<std::int32_t> i32(1009);
    for (std::size_t i = 0; i < d.size(); ++i) {
      d[i] = static_cast<double>(r * 3 + static_cast<int>(i % 5));
      i32[i] = r * 3 + static_cast<int>(i % 5);
    }
    pg->all_reduce(d.data(), d.size(), DataType::kFloat64, op);
    pg->all_reduce(i32.data(), i32.size(), DataType::kInt32, op);
    for (std::size_t i = 0; i < d.size(); ++i) {
      double base = static_cast<double>(i % 5), sum = n * base + 3.0 * n * (n - 1) / 2;
      double want = op == ReduceOp::kSum ? sum : op == ReduceOp::kAvg ? sum / n : op == ReduceOp::kMin ? base : base + 3 * (n - 1);
      if (std::abs(d[i] - want) > 1e-9 || i32[i] != static_cast<std::int32_t>(op == ReduceOp::kAvg ? std::trunc(want) : want)) {
        std::printf("wrong %s at %zu: %f / %d, want %f\n", name(op), i, d[i], i32[i], want);
        return 1;
      }
    }
  }
  std::vector<float> all(static_cast<std::size_t>(n));
  float mine = static_cast<float>(r);
  pg->all_gather(&mine, all.data(), 1, DataType::kFloat32);
  for (int k = 0; k < n; ++k) {
    if (all[k] != static_cast<float>(k)) return 1;
  }
  pg->barrier();
  std::printf("collectives ok on rank %d of %d\n", r, n);
  return 0;
}

int peer_dies() {
  ProcessGroupOptions opt;
  opt.timeout = std::chrono::seconds(10);
  auto pg = init_process_group("gloo", opt);
  pg->barrier();
  if (pg->rank() == 1) std::_Exit(0);  // gone without a word, mid-job
  auto t0 = std::chrono::steady_clock::now();
  try {
    std::vector<float> x(1 << 20, 1.0f);
    for (int k = 0; k < 100; ++k) pg->all_reduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
    std::printf("no error\n");
    return 0;
  } catch (const ddprun::Error& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("error after %.2f s: %s\n", s, e.what());
    return 3;
  }
}

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "collectives") return collectives();
    if (mode == "peer_dies") return peer_dies();
    if (mode == "sampler" && argc == 8) {
      DistributedSampler s(std::stoul(argv[2]), std::stoi(argv[3]), std::stoi(argv[4]), std::string(argv[5]) == "1",
                           0, std::string(argv[7]) == "1");
      s.set_epoch(std::stoul(argv[6]));
      for (auto i : s.indices()) std::printf("%lld ", static_cast<long long>(i));
      std::printf("\n");
      return 0;
    }
  } catch (const ddprun::Error& e) {
    std::fprintf(stderr, "runtime_worker: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: runtime_worker collectives|peer_dies|sampler N W R SHUFFLE EPOCH DROP_LAST\n");
  return 2;
}
