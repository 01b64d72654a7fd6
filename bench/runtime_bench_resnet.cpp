// runtime_bench resnet50: gradient sync of ResNet-50's 161 parameter tensors (25.6 M floats) on
// the group's memory: one flat all_reduce vs the bucketed Reducer, and the Reducer overlapped
// with a synthetic backward. On nccl every timing ends after the host waited for the device.

#include <algorithm>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#include "ddprun/runtime/reducer.hpp"
#include "runtime_bench.hpp"

namespace ddprun::bench {

using namespace ddprun::runtime;

namespace {

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

// Synthetic backward compute for `seconds`: spinning (CPU compute, competing with communication
// for this machine's 2 cores) or sleeping (device compute, which leaves the CPU to communication).
void compute_for(double seconds, bool sleep) {
  auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  if (sleep) {
    std::this_thread::sleep_until(end);
    return;
  }
  while (Clock::now() < end) {
  }
}

struct Setup {
  std::shared_ptr<ProcessGroup> pg;
  std::vector<ParameterSpec> params;
  std::size_t total = 0;
  std::unique_ptr<Buffer> flat;
  std::unique_ptr<Reducer> red;
  bool sleep = false;

  // Backward, last layer first, each tensor's compute proportional to its size; then finalize.
  void step(double compute_total) {
    for (std::size_t k = params.size(); k-- > 0;) {
      if (compute_total > 0) {
        compute_for(compute_total * static_cast<double>(params[k].count) / static_cast<double>(total), sleep);
      }
      red->mark_ready(k);
    }
    red->finalize();
  }
  // The Reducer's bucket sizes as plain asynchronous all-reduces, no Reducer: separates the cost
  // of more collectives from the cost of the Reducer's own logic.
  void split_all_reduce() {
    std::vector<std::shared_ptr<Work>> works;
    std::size_t off = 0;
    for (const auto& b : red->buckets()) {
      std::size_t c = b.bytes / 4;
      works.push_back(pg->all_reduce_async(flat->data() + off, c, DataType::kFloat32, ReduceOp::kAvg));
      off += c;
    }
    works.back()->wait();
    for (auto& w : works) w->wait();
  }
  // Seconds `op` takes, from a barrier to the host having waited for the device.
  double timed(const std::function<void()>& op) {
    pg->barrier();
    auto t0 = Clock::now();
    op();
    settle(*pg, *flat);
    return since(t0);
  }
};

}  // namespace

int resnet50(const std::shared_ptr<ProcessGroup>& pg, const Args& args) {
  Setup s;
  s.pg = pg;
  s.sleep = args.compute_sleep;
  for (auto c : resnet50_shapes()) {
    s.params.push_back({c, DataType::kFloat32});
    s.total += c;
  }
  s.flat = std::make_unique<Buffer>(*pg, s.total);
  ReducerOptions ropt;
  if (args.bucket_cap_mb > 0) ropt.bucket_cap_bytes = static_cast<std::size_t>(args.bucket_cap_mb * 1024 * 1024);
  ropt.broadcast_parameters = false;  // gradients only: the values are not trained
  s.red = std::make_unique<Reducer>(pg, s.params, ropt);
  auto flat_sync = [&] { pg->all_reduce(s.flat->data(), s.total, DataType::kFloat32, ReduceOp::kAvg); };
  auto flat_async = [&] { pg->all_reduce_async(s.flat->data(), s.total, DataType::kFloat32, ReduceOp::kAvg)->wait(); };
  s.timed(flat_sync);
  s.timed([&] { s.step(0); });
  // Measured alternately, so that every variant sees the same machine noise.
  const int iters = 9;
  std::vector<double> t_flat, t_flat_async, t_bucket, t_split, t_overlap, t_compute_only;
  for (int i = 0; i < iters; ++i) {
    t_flat.push_back(s.timed(flat_sync));
    t_flat_async.push_back(s.timed(flat_async));
    t_bucket.push_back(s.timed([&] { s.step(0); }));
    t_split.push_back(s.timed([&] { s.split_all_reduce(); }));
  }
  const double compute = args.compute_ms / 1000.0;
  for (int i = 0; i < iters; ++i) {
    t_compute_only.push_back(s.timed([&] { compute_for(compute, s.sleep); }));
    t_overlap.push_back(s.timed([&] { s.step(compute); }));
  }
  double f = median(t_flat), b = median(t_bucket), o = median(t_overlap), c = median(t_compute_only);
  double hidden = std::clamp((c + b - o) / b, 0.0, 1.0);
  if (pg->rank() == 0) {
    std::printf("{\"kind\": \"resnet50\", \"backend\": \"%s\", \"ranks\": %d, \"tensors\": %zu, \"params\": %zu, "
                "\"buckets\": %zu, \"flat_s\": %.4f, \"flat_async_s\": %.4f, \"split_async_s\": %.4f, "
                "\"reducer_s\": %.4f, \"compute_s\": %.4f, \"overlapped_s\": %.4f, \"hidden\": %.3f}\n",
                pg->backend(), pg->size(), s.params.size(), s.total, s.red->buckets().size(), f, median(t_flat_async),
                median(t_split), b, c, o, hidden);
  }
  return 0;
}

}  // namespace ddprun::bench
