// runtime_bench cost: the host time one collective costs the calling thread, one rank, small
// tensors (the issue of a native trainer with a tiny model: per-step overhead, not bandwidth).
//
//   fake  the nccl backend on the fake NCCL/CUDA (tests/fakes): no GPU needed; the fake
//         answers as NCCL 2.28 does for the kind of communicator the backend creates
//   nccl  the real NCCL on GPU 0 (one rank)
//   gloo  for comparison
//
// Measured, each the median of 5 runs of --iters:
//   us_per_collective         an asynchronous all_reduce of `count` float32 and its wait(), back
//                             to back: the host's cost (on nccl wait() does not block the host;
//                             the fake runs the "device" work on the calling thread, so its
//                             figure includes that too)
//   us_per_collective_cpu     the same loop's CPU time on the issuing thread (what --max_us
//                             bounds): wall time on a machine whose cores other work keeps busy
//                             counts the time the thread was not running (beside four CPU hogs
//                             on 2 cores: 13.2 us wall, 2.3 us CPU; a fresh clone's ctest once
//                             failed at 17.7 us wall), where the CPU time does not
//   us_per_collective_synced  the same with synchronize() (the host waits for each collective)
//   us_per_reducer_step       a Reducer step of train_linear_cuda's model (256 + 1 floats) in
//                             two buckets (mark_ready x2 + finalize)

#include <time.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/common/error.hpp"
#include "ddprun/rendezvous/prefix_store.hpp"
#include "ddprun/rendezvous/store_server.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"
#include "ddprun/runtime/process_group.hpp"
#include "ddprun/runtime/reducer.hpp"
#include "fake_nccl.hpp"
#include "group_keys.hpp"
#include "nccl_group.hpp"
#include "runtime_bench.hpp"

namespace ddprun::bench {

using namespace ddprun::runtime;

namespace {

struct LocalStore {
  rendezvous::StoreServer server{[] {
    rendezvous::StoreServerOptions o;
    o.host = "127.0.0.1";
    return o;
  }()};
  LocalStore() { server.start(); }
  std::shared_ptr<rendezvous::Store> client(const std::string& prefix) {
    rendezvous::TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = server.port();
    o.timeout = std::chrono::seconds(60);
    return std::make_shared<rendezvous::PrefixStore>(prefix, std::make_shared<rendezvous::TcpStore>(o));
  }
};

std::shared_ptr<ProcessGroup> one_rank_group(const std::string& backend, LocalStore& store) {
  if (backend == "fake") {
    auto api = nccl::fake::make_api(std::make_shared<nccl::fake::State>());
    return nccl::make_process_group(api, next_group_store(store.client("fake"), 0), 0, 1, {}, {0, 1});
  }
  return create_process_group(backend, store.client(backend), 0, 1);
}

double thread_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

struct Cost {
  double wall_us;
  double cpu_us;
};

Cost per_collective_us(ProcessGroup& pg, void* buf, std::size_t count, int iters, bool synced) {
  auto one = [&] {
    auto w = pg.all_reduce_async(buf, count, DataType::kFloat32, ReduceOp::kAvg);
    synced ? w->synchronize() : w->wait();
  };
  for (int i = 0; i < 100; ++i) one();
  pg.barrier();
  auto t0 = Clock::now();
  double cpu0 = thread_cpu_s();
  for (int i = 0; i < iters; ++i) one();
  Cost c{since(t0) * 1e6 / iters, (thread_cpu_s() - cpu0) * 1e6 / iters};
  pg.barrier();  // the device catches up before the next measurement
  return c;
}

double per_step_us(const std::shared_ptr<ProcessGroup>& pg, int iters) {
  ReducerOptions o;
  o.first_bucket_bytes = 64;  // two buckets: the bias, then the weights
  o.broadcast_parameters = false;
  Reducer red(pg, {{256}, {1}}, o);
  auto step = [&] {
    red.mark_ready(1);
    red.mark_ready(0);
    red.finalize();
  };
  for (int i = 0; i < 100; ++i) step();
  pg->barrier();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) step();
  double us = since(t0) * 1e6 / iters;
  pg->barrier();
  return us;
}

}  // namespace

int collective_cost(const Args& args) {
  LocalStore store;
  auto pg = one_rank_group(args.backend, store);
  const std::size_t count = args.count;
  void* buf = pg->allocate(count * sizeof(float));
  std::vector<double> collective, collective_cpu, synced, step;
  for (int round = 0; round < 5; ++round) {
    Cost c = per_collective_us(*pg, buf, count, args.iters, false);
    collective.push_back(c.wall_us);
    collective_cpu.push_back(c.cpu_us);
    synced.push_back(per_collective_us(*pg, buf, count, args.iters, true).wall_us);
    step.push_back(per_step_us(pg, args.iters));
  }
  pg->deallocate(buf);
  std::printf("{\"kind\": \"collective_cost\", \"backend\": \"%s\", \"count\": %zu, \"iters\": %d, "
              "\"us_per_collective\": %.2f, \"us_per_collective_cpu\": %.2f, \"us_per_collective_synced\": %.2f, "
              "\"us_per_reducer_step\": %.2f}\n",
              args.backend.c_str(), count, args.iters, median(collective), median(collective_cpu), median(synced),
              median(step));
  if (args.max_us > 0 && median(collective_cpu) > args.max_us) {
    std::fprintf(stderr,
                 "runtime_bench: %.2f us of the issuing thread's CPU per collective is over the limit of %.2f us "
                 "(--max_us)\n",
                 median(collective_cpu), args.max_us);
    return 1;
  }
  return 0;
}

}  // namespace ddprun::bench
