// Runtime benchmarks, run under ddprun (one process per rank):
//   runtime_bench busbw              all_reduce (float32 sum) from 4 KiB to 256 MiB: busBw per size
//   runtime_bench reduce_scatter     reduce_scatter (float32 sum) 64 KiB to 256 MiB: the ring vs
//                                    all_reduce + slice
//   runtime_bench resnet50 [--compute_ms X] [--compute spin|sleep] [--bucket_cap_mb MB]
//                                    gradient sync of ResNet-50's 161 parameter tensors (25.6 M
//                                    floats): one flat all_reduce vs the bucketed Reducer, and
//                                    the Reducer overlapped with a synthetic backward
//                                    (runtime_bench_resnet.cpp)
//   runtime_bench cost [--backend fake|nccl|gloo]   host cost of one small collective, one rank
//                                    (runtime_bench_cost.cpp; needs no launcher)
// --backend nccl: busbw and resnet50 on device memory (one GPU per rank, or ranks sharing one:
// scripts/gpu_check.sh). Times are taken after the host has waited for the device.
// Rank 0 prints one JSON object per measurement.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ddprun/common/error.hpp"
#include "ddprun/runtime/process_group.hpp"
#include "ddprun/runtime/reducer.hpp"
#include "runtime_bench.hpp"

using namespace ddprun::runtime;
using ddprun::bench::Clock;
using ddprun::bench::median;
using ddprun::bench::since;

namespace {

// all_reduce float32 sum from 4 KiB to 256 MiB on the group's memory (device memory on nccl).
int busbw(ProcessGroup& pg) {
  int n = pg.size();
  for (std::size_t bytes = 4096; bytes <= (std::size_t{256} << 20); bytes *= 4) {
    std::size_t count = bytes / 4;
    ddprun::bench::Buffer buf(pg, count);
    int iters = bytes <= (1 << 20) ? 50 : bytes <= (16 << 20) ? 10 : 3;
    pg.all_reduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum);  // warm-up
    ddprun::bench::settle(pg, buf);
    std::vector<double> times;
    for (int i = 0; i < iters; ++i) {
      pg.barrier();
      auto t0 = Clock::now();
      pg.all_reduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum);
      ddprun::bench::settle(pg, buf);
      times.push_back(since(t0));
    }
    double t = ddprun::bench::max_over_ranks(pg, median(times));
    double alg = static_cast<double>(bytes) / t / 1e9;
    if (pg.rank() == 0) {
      std::printf("{\"kind\": \"busbw\", \"impl\": \"ddprun\", \"backend\": \"%s\", \"ranks\": %d, \"bytes\": %zu, "
                  "\"seconds\": %.6f, \"busbw_gbps\": %.4f}\n",
                  pg.backend(), n, bytes, t, alg * 2.0 * (n - 1) / n);
      std::fflush(stdout);
    }
  }
  return 0;
}

// reduce_scatter float32 sum, `bytes` = the whole input of one rank (nccl-tests' size): the
// ring, and an all_reduce of the whole input followed by taking this rank's block (what the gloo
// backend did before). busBw = algBw * (n-1)/n, as nccl-tests compute it for reduce_scatter.
int busbw_reduce_scatter(ProcessGroup& pg) {
  if (std::string(pg.backend()) != "gloo") {
    std::fprintf(stderr, "runtime_bench: reduce_scatter compares host-memory variants: gloo only\n");
    return 2;
  }
  const int n = pg.size();
  for (std::size_t bytes = std::size_t{64} << 10; bytes <= (std::size_t{256} << 20); bytes *= 4) {
    std::size_t count = bytes / 4 / static_cast<std::size_t>(n);
    std::vector<float> in(count * n, 1.0f), out(count), tmp(count * n);
    int iters = bytes <= (1 << 20) ? 30 : bytes <= (16 << 20) ? 8 : 3;
    auto ring = [&] { pg.reduce_scatter(in.data(), out.data(), count, DataType::kFloat32, ReduceOp::kSum); };
    auto slice = [&] {
      std::memcpy(tmp.data(), in.data(), tmp.size() * 4);
      pg.all_reduce(tmp.data(), tmp.size(), DataType::kFloat32, ReduceOp::kSum);
      std::memcpy(out.data(), tmp.data() + count * pg.rank(), count * 4);
    };
    double t_ring = 0, t_slice = 0;
    for (int which = 0; which < 2; ++which) {
      std::function<void()> op = which == 0 ? std::function<void()>(ring) : std::function<void()>(slice);
      op();  // warm-up
      std::vector<double> times;
      for (int i = 0; i < iters; ++i) {
        pg.barrier();
        auto t0 = Clock::now();
        op();
        times.push_back(since(t0));
      }
      double t = median(times);
      pg.all_reduce(&t, 1, DataType::kFloat64, ReduceOp::kMax);
      (which == 0 ? t_ring : t_slice) = t;
    }
    if (pg.rank() == 0) {
      auto bus = [&](double t) { return static_cast<double>(count * n * 4) / t / 1e9 * (n - 1) / n; };
      std::printf("{\"kind\": \"reduce_scatter\", \"ranks\": %d, \"bytes\": %zu, \"ring_s\": %.6f, "
                  "\"slice_s\": %.6f, \"ring_busbw_gbps\": %.4f, \"slice_busbw_gbps\": %.4f}\n",
                  n, count * n * 4, t_ring, t_slice, bus(t_ring), bus(t_slice));
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ddprun::bench::Args args;
  args.mode = argc > 1 ? argv[1] : "";
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--compute_ms") args.compute_ms = std::stod(v);
    if (k == "--compute") args.compute_sleep = v == "sleep";
    if (k == "--bucket_cap_mb") args.bucket_cap_mb = std::stod(v);
    if (k == "--backend") args.backend = v;
    if (k == "--count") args.count = std::stoul(v);
    if (k == "--iters") args.iters = std::stoi(v);
    if (k == "--max_us") args.max_us = std::stod(v);
  }
  try {
    if (args.mode == "cost") return ddprun::bench::collective_cost(args);
    auto pg = init_process_group(args.backend);
    if (args.mode == "busbw") return busbw(*pg);
    if (args.mode == "reduce_scatter") return busbw_reduce_scatter(*pg);
    if (args.mode == "resnet50") return ddprun::bench::resnet50(pg, args);
  } catch (const ddprun::Error& e) {
    std::fprintf(stderr, "runtime_bench: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: runtime_bench busbw | reduce_scatter | resnet50 [--compute_ms X] [--compute spin|sleep] "
                       "[--bucket_cap_mb MB] [--backend gloo|nccl]\n"
                       "       runtime_bench cost [--backend fake|nccl|gloo] [--count N] [--iters N] [--max_us X]\n");
  return 2;
}
