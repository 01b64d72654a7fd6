// gpu_tests: the nccl backend on real GPUs (gpu_checks.cpp), one line per check. Exits 77
// (skipped) where no GPU is usable, 1 when a check failed.
//
//   gpu_tests                     one rank per visible GPU, as threads of this process
//   ddprun ... gpu_tests          one rank per process, the launcher's environment (several
//                                 ranks on one GPU: see scripts/gpu_check.sh)

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <thread>
#include <vector>

#include "ddprun/runtime/process_group.hpp"
#include "gpu_checks.hpp"
#include "group_fixture.hpp"

using namespace ddprun;
using namespace ddprun::runtime;

namespace {

// Runs every check on this rank: check name -> what went wrong ("" when nothing did).
std::map<std::string, std::string> run_checks(const std::shared_ptr<ProcessGroup>& pg) {
  std::map<std::string, std::string> out;
  for (const auto& c : test::gpu::checks()) {
    out[c.name] = test::message_of([&] {
      std::string bad = c.run(pg);
      if (!bad.empty()) throw std::runtime_error(bad);
    });
  }
  return out;
}

int report(const std::vector<std::map<std::string, std::string>>& per_rank, int first_rank) {
  int failed = 0;
  for (const auto& c : test::gpu::checks()) {
    std::string why;
    for (std::size_t k = 0; k < per_rank.size(); ++k) {
      auto it = per_rank[k].find(c.name);
      std::string msg = it == per_rank[k].end() ? "not run" : it->second;
      if (!msg.empty()) why += " rank " + std::to_string(first_rank + static_cast<int>(k)) + ": " + msg;
    }
    std::printf("%s %s%s\n", why.empty() ? "PASS" : "FAIL", c.name, why.c_str());
    failed += why.empty() ? 0 : 1;
  }
  std::fflush(stdout);
  return failed ? 1 : 0;
}

int as_threads(int n) {
  test::Ranks ranks;
  std::vector<std::map<std::string, std::string>> results(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto& mine = results[static_cast<std::size_t>(r)];
      std::string err = test::message_of([&] {
        cudaSetDevice(r);  // the trainer's own CUDA calls; the group sets its device itself
        ProcessGroupOptions opt;
        opt.device = r;
        opt.timeout = std::chrono::seconds(60);
        mine = run_checks(create_process_group("nccl", ranks.store("gpu"), r, n, opt));
      });
      if (!err.empty()) mine["(creating the group)"] = err;
    });
  }
  for (auto& t : threads) t.join();
  return report(results, 0);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: no usable GPU (cudaGetDeviceCount: %s)\n", cudaGetErrorString(cudaGetLastError()));
    return 77;
  }
  if (!std::getenv("RANK")) return as_threads(devices);
  std::map<std::string, std::string> mine;
  std::string err = test::message_of([&] {
    ProcessGroupOptions opt;
    opt.timeout = std::chrono::seconds(60);
    auto pg = init_process_group("nccl", opt);
    cudaSetDevice(pg->rank() % devices);
    mine = run_checks(pg);
  });
  if (!err.empty()) {
    std::printf("FAIL creating the group: %s\n", err.c_str());
    return 1;
  }
  return report({mine}, std::atoi(std::getenv("RANK")));
}
