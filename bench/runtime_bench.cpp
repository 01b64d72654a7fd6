// Runtime benchmarks, run under ddprun (one process per rank):
//   runtime_bench busbw              all_reduce (float32 sum) from 4 KiB to 256 MiB: busBw per size
//   runtime_bench reduce_scatter     reduce_scatter (float32 sum) 64 KiB to 256 MiB: the ring vs
//                                    all_reduce + slice
//   runtime_bench resnet50 [--compute_ms X] [--compute spin|sleep] [--bucket_cap_mb MB]
//                                    gradient sync of ResNet-50's 161 parameter tensors (25.6 M
//                                    floats): one flat all_reduce vs the bucketed Reducer, and
//                                    the Reducer overlapped with a synthetic backward
//   runtime_bench cost [--backend fake|nccl|gloo]   host cost of one small collective, one rank
//                                    (runtime_bench_cost.cpp; needs no launcher)
// Rank 0 prints one JSON object per measurement.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
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

int busbw(ProcessGroup& pg) {
  int n = pg.size();
  for (std::size_t bytes = 4096; bytes <= (std::size_t{256} << 20); bytes *= 4) {
    std::size_t count = bytes / 4;
    std::vector<float> buf(count, 1.0f);
    int iters = bytes <= (1 << 20) ? 50 : bytes <= (16 << 20) ? 10 : 3;
    pg.all_reduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum);  // warm-up
    std::vector<double> times;
    for (int i = 0; i < iters; ++i) {
      pg.barrier();
      auto t0 = Clock::now();
      pg.all_reduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum);
      times.push_back(since(t0));
    }
    // Every rank's time: the slowest rank bounds the collective.
    double t = median(times);
    pg.all_reduce(&t, 1, DataType::kFloat64, ReduceOp::kMax);
    double alg = static_cast<double>(bytes) / t / 1e9;
    if (pg.rank() == 0) {
      std::printf("{\"kind\": \"busbw\", \"impl\": \"ddprun\", \"ranks\": %d, \"bytes\": %zu, \"seconds\": %.6f, "
                  "\"busbw_gbps\": %.4f}\n",
                  n, bytes, t, alg * 2.0 * (n - 1) / n);
      std::fflush(stdout);
    }
  }
  return 0;
}

// reduce_scatter float32 sum, `bytes` = the whole input of one rank (nccl-tests' size): the
// ring, and an all_reduce of the whole input followed by taking this rank's block (what the gloo
// backend did before). busBw = algBw * (n-1)/n, as nccl-tests compute it for reduce_scatter.
int busbw_reduce_scatter(ProcessGroup& pg) {
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

// ResNet-50 (torchvision) parameter tensors, in registration order.
std::vector<std::size_t> resnet50_shapes() {
  std::vector<std::size_t> s;
  auto conv = [&](std::size_t out, std::size_t in, std::size_t k) { s.push_back(out * in * k * k); };
  auto bn = [&](std::size_t c) {
    s.push_back(c);
    s.push_back(c);
  };
  conv(64, 3, 7);
  bn(64);
  std::size_t in = 64;
  struct Stage {
    int blocks;
    std::size_t width;
  };
  for (Stage st : {Stage{3, 64}, Stage{4, 128}, Stage{6, 256}, Stage{3, 512}}) {
    std::size_t out = st.width * 4;
    for (int b = 0; b < st.blocks; ++b) {
      conv(st.width, in, 1);
      bn(st.width);
      conv(st.width, st.width, 3);
      bn(st.width);
      conv(out, st.width, 1);
      bn(out);
      if (b == 0) {
        conv(out, in, 1);  // downsample
        bn(out);
      }
      in = out;
    }
  }
  s.push_back(1000 * 2048);
  s.push_back(1000);
  return s;
}

// Synthetic per-layer backward compute: spinning (CPU compute, competing with communication for
// this machine's 2 cores) or sleeping (device compute, which leaves the CPU to communication).
bool g_sleep = false;
double g_bucket_cap_mb = 0;  // 0: the Reducer's default (25 MiB)
void spin(double seconds) {
  auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  if (g_sleep) {
    std::this_thread::sleep_until(end);
    return;
  }
  while (Clock::now() < end) {
  }
}

int resnet50(const std::shared_ptr<ProcessGroup>& pg, double compute_ms_total) {
  auto shapes = resnet50_shapes();
  std::size_t total = 0;
  for (auto c : shapes) total += c;
  std::vector<ParameterSpec> params;
  for (auto c : shapes) params.push_back({c, DataType::kFloat32});
  const int iters = 9;

  // 1. one flat all_reduce of the same bytes, and 2. the Reducer with gradients ready back to
  // back (communication alone), measured alternately so that both see the same machine noise.
  std::vector<float> flat(total, 1.0f);
  ReducerOptions ropt;
  if (g_bucket_cap_mb > 0) ropt.bucket_cap_bytes = static_cast<std::size_t>(g_bucket_cap_mb * 1024 * 1024);
  Reducer red(pg, params, ropt);
  auto sync = [&](double compute_total) {
    // Backward: last layer first, each tensor's compute proportional to its size.
    for (std::size_t k = params.size(); k-- > 0;) {
      if (compute_total > 0) spin(compute_total * static_cast<double>(params[k].count) / static_cast<double>(total));
      red.mark_ready(k);
    }
    red.finalize();
  };
  pg->all_reduce(flat.data(), total, DataType::kFloat32, ReduceOp::kAvg);
  sync(0);
  std::vector<double> t_flat, t_flat_async, t_bucket, t_split;
  for (int i = 0; i < iters; ++i) {
    pg->barrier();
    auto t0 = Clock::now();
    pg->all_reduce(flat.data(), total, DataType::kFloat32, ReduceOp::kAvg);
    t_flat.push_back(since(t0));
    pg->barrier();
    t0 = Clock::now();
    pg->all_reduce_async(flat.data(), total, DataType::kFloat32, ReduceOp::kAvg)->wait();
    t_flat_async.push_back(since(t0));
    pg->barrier();
    t0 = Clock::now();
    sync(0);
    t_bucket.push_back(since(t0));
    // The Reducer's bucket sizes as plain asynchronous all-reduces, no Reducer: separates the
    // cost of more collectives from the cost of the Reducer's own logic.
    pg->barrier();
    t0 = Clock::now();
    {
      std::vector<std::shared_ptr<Work>> works;
      std::size_t off = 0;
      for (const auto& b : red.buckets()) {
        std::size_t c = b.bytes / 4;
        works.push_back(pg->all_reduce_async(flat.data() + off, c, DataType::kFloat32, ReduceOp::kAvg));
        off += c;
      }
      works.back()->wait();
      for (auto& w : works) w->wait();
    }
    t_split.push_back(since(t0));
  }
  // 3. the Reducer overlapped with a synthetic backward of compute_ms_total
  double compute = compute_ms_total / 1000.0;
  std::vector<double> t_overlap, t_compute_only;
  for (int i = 0; i < iters; ++i) {
    pg->barrier();
    auto t0 = Clock::now();
    for (std::size_t k = params.size(); k-- > 0;) spin(compute * static_cast<double>(params[k].count) / static_cast<double>(total));
    t_compute_only.push_back(since(t0));
    pg->barrier();
    t0 = Clock::now();
    sync(compute);
    t_overlap.push_back(since(t0));
  }
  double f = median(t_flat), b = median(t_bucket), o = median(t_overlap), c = median(t_compute_only);
  double hidden = std::clamp((c + b - o) / b, 0.0, 1.0);
  if (pg->rank() == 0) {
    std::printf("{\"kind\": \"resnet50\", \"ranks\": %d, \"tensors\": %zu, \"params\": %zu, \"buckets\": %zu, "
                "\"flat_s\": %.4f, \"flat_async_s\": %.4f, \"split_async_s\": %.4f, \"reducer_s\": %.4f, \"compute_s\": %.4f, \"overlapped_s\": %.4f, \"hidden\": %.3f}\n",
                pg->size(), shapes.size(), total, red.buckets().size(), f, median(t_flat_async), median(t_split), b, c, o,
                hidden);
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
  }
  g_sleep = args.compute_sleep;
  g_bucket_cap_mb = args.bucket_cap_mb;
  try {
    if (args.mode == "cost") return ddprun::bench::collective_cost(args);
    auto pg = init_process_group("gloo");
    if (args.mode == "busbw") return busbw(*pg);
    if (args.mode == "reduce_scatter") return busbw_reduce_scatter(*pg);
    if (args.mode == "resnet50") return resnet50(pg, args.compute_ms);
  } catch (const ddprun::Error& e) {
    std::fprintf(stderr, "runtime_bench: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: runtime_bench busbw | reduce_scatter | resnet50 [--compute_ms X] | "
                       "cost [--backend fake|nccl|gloo] [--count N] [--iters N]\n");
  return 2;
}
