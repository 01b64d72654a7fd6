// GPU tests of the nccl backend: collectives on device memory and the Reducer, one rank per
// visible GPU (threads). Exits 77 (skipped) where no GPU is usable.

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "ddprun/common/error.hpp"
#include "ddprun/runtime/reducer.hpp"
#include "group_fixture.hpp"

using namespace ddprun;
using namespace ddprun::runtime;

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: no usable GPU (cudaGetDeviceCount: %s)\n", cudaGetErrorString(cudaGetLastError()));
    return 77;
  }
  test::Ranks ranks;
  int n = devices;
  std::vector<std::thread> threads;
  std::vector<int> failures(n, 0);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ProcessGroupOptions opt;
        opt.device = r;
        opt.timeout = std::chrono::seconds(60);
        auto pg = create_process_group("nccl", ranks.store("gpu"), r, n, opt);
        cudaSetDevice(r);
        // all_reduce of 10M floats, every op
        std::size_t count = 10 * 1000 * 1000;
        std::vector<float> host(count, static_cast<float>(r + 1));
        void* dev = pg->allocate(count * sizeof(float));
        for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
          pg->copy_to_device(dev, host.data(), count * sizeof(float));
          pg->all_reduce(dev, count, DataType::kFloat32, op);
          std::vector<float> back(count);
          pg->copy_to_host(back.data(), dev, count * sizeof(float));
          float want = op == ReduceOp::kSum ? n * (n + 1) / 2.0f
                       : op == ReduceOp::kAvg ? (n + 1) / 2.0f
                       : op == ReduceOp::kMin ? 1.0f
                                              : static_cast<float>(n);
          if (std::abs(back[count - 1] - want) > 1e-5f) failures[r]++;
        }
        pg->deallocate(dev);
        // the Reducer on device memory
        Reducer red(pg, {{1000}, {300000}, {7}});
        for (std::size_t k = 0; k < 3; ++k) {
          std::vector<float> g(k == 0 ? 1000 : k == 1 ? 300000 : 7, static_cast<float>(r));
          pg->copy_to_device(red.grad(k), g.data(), g.size() * sizeof(float));
        }
        for (std::size_t k = 3; k-- > 0;) red.mark_ready(k);
        red.finalize();
        float v = -1;
        pg->copy_to_host(&v, red.grad(1), sizeof(float));
        if (std::abs(v - (n - 1) / 2.0f) > 1e-5f) failures[r]++;
        pg->barrier();
      } catch (const std::exception& e) {
        std::printf("rank %d: %s\n", r, e.what());
        failures[r]++;
      }
    });
  }
  for (auto& t : threads) t.join();
  int total = 0;
  for (int f : failures) total += f;
  std::printf("%d passed, %d failed\n", total ? 0 : 1, total ? 1 : 0);
  return total ? 1 : 0;
}
