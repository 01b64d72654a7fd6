// A native trainer making the usual mistakes, run under ddprun by tests/runtime_mistakes_test.sh.
// Every mode reports an exception as "ERROR <kind>: <message>" on stderr and exits 3.
//   count_mismatch   rank 0 all-reduces 8 floats, the others 4
//   dtype_mismatch   rank 0 all-reduces 4 float64, the others 4 float32
//   reducer_mismatch rank 1 registers a parameter of another size
//   no_broadcast     ranks start from different parameters and never call broadcast_tensors;
//                    prints "PARAMS rank R: CHECKSUM" after the Reducer is made
//   no_finalize      iterations whose optimizer step reads the gradients without finalize()
//   raise            rank 1 throws after one all-reduce; the others all-reduce again
//   stuck_outside    rank 0 stops calling collectives (loops in stuck_outside_collectives),
//                    the others all-reduce
//   cost             microseconds per all_reduce (1 float, 1 Mi floats; median and 10th percentile),
//                    with the debug mode off and on, side by side, and their ratio
// The time-out of collectives: MW_TIMEOUT_MS (default 3000).

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/common/error.hpp"
#include "ddprun/runtime/heartbeat.hpp"
#include "ddprun/runtime/process_group.hpp"
#include "ddprun/runtime/reducer.hpp"

using namespace ddprun::runtime;

namespace {

ProcessGroupOptions options() {
  ProcessGroupOptions o;
  const char* t = std::getenv("MW_TIMEOUT_MS");
  o.timeout = std::chrono::milliseconds(t ? std::atoi(t) : 3000);
  return o;
}

int count_mismatch() {
  auto pg = init_process_group("gloo", options());
  std::vector<float> x(pg->rank() == 0 ? 8 : 4, 1.0f);
  pg->all_reduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
  return 0;
}

int dtype_mismatch() {
  auto pg = init_process_group("gloo", options());
  std::vector<double> d(4, 1.0);
  std::vector<float> f(4, 1.0f);
  if (pg->rank() == 0) {
    pg->all_reduce(d.data(), d.size(), DataType::kFloat64, ReduceOp::kSum);
  } else {
    pg->all_reduce(f.data(), f.size(), DataType::kFloat32, ReduceOp::kSum);
  }
  return 0;
}

int reducer_mismatch() {
  auto pg = init_process_group("gloo", options());
  std::vector<float> w(16), b(pg->rank() == 1 ? 8 : 4);
  ReducerOptions ro;
  Reducer red(pg, {{w.size(), DataType::kFloat32, w.data()}, {b.size(), DataType::kFloat32, b.data()}}, ro);
  return 0;
}

int no_broadcast() {
  auto pg = init_process_group("gloo", options());
  std::vector<float> w(1000);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>((i * 7 + 13 * pg->rank()) % 101) / 101.0f;
  Reducer red(pg, {{w.size(), DataType::kFloat32, w.data()}});
  double sum = 0;
  for (std::size_t i = 0; i < w.size(); ++i) sum += w[i] * static_cast<double>(i + 1);
  std::printf("PARAMS rank %d: %.6f\n", pg->rank(), sum);
  return 0;
}

int no_finalize() {
  auto pg = init_process_group("gloo", options());
  std::vector<float> w(64, 0.5f);
  Reducer red(pg, {{w.size(), DataType::kFloat32, w.data()}});
  for (int step = 0; step < 2; ++step) {
    red.zero_grad();
    red.grad_as<float>(0)[0] = 1.0f + static_cast<float>(pg->rank());
    red.mark_ready(0);
    // (finalize() forgotten): the optimizer step reads the gradient
    const float* g = red.grad_as<float>(0);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] -= 0.1f * g[i];
    std::fprintf(stderr, "APPLIED step %d\n", step);
  }
  return 0;
}

int raise_on_rank1() {
  auto pg = init_process_group("gloo", options());
  float x = 1;
  pg->all_reduce(&x, 1, DataType::kFloat32, ReduceOp::kSum);
  if (pg->rank() == 1) {
    std::fprintf(stderr, "RAISING at %.3f\n",
                 std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
    throw std::runtime_error("the data loader found a corrupt batch");
  }
  pg->all_reduce(&x, 1, DataType::kFloat32, ReduceOp::kSum);
  return 0;
}

// Beats once more a second later (so the rank waiting in all_reduce misses its heartbeat first,
// as in the issue), then never again.
__attribute__((noinline)) void stuck_outside_collectives() {
  auto beat_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(1200);
  while (std::chrono::steady_clock::now() < beat_at) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  heartbeat();
  for (;;) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

int stuck_outside() {
  auto pg = init_process_group("gloo", options());
  float x = 1;
  for (int i = 0; i < 3; ++i) pg->all_reduce(&x, 1, DataType::kFloat32, ReduceOp::kSum);
  if (pg->rank() == 0) stuck_outside_collectives();
  pg->all_reduce(&x, 1, DataType::kFloat32, ReduceOp::kSum);
  return 0;
}

// The debug mode's price, side by side in one job: the world group (mode off, unless
// DDPRUN_DISTRIBUTED_DEBUG says otherwise) and a copy of it made by split() with
// check_collectives (on) take turns, in rounds, so both see the same load on the machine.
std::vector<double> time_calls(ProcessGroup& g, std::vector<float>& x, int calls) {
  std::vector<double> us;
  for (int i = 0; i < calls; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    g.all_reduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return us;
}

int cost() {
  auto off = init_process_group("gloo", options());
  auto on_options = off->options();
  on_options.check_collectives = true;
  auto on = off->split(0, off->rank(), on_options);
  for (std::size_t count : {std::size_t{1}, std::size_t{1} << 20}) {
    std::vector<float> x(count, 1.0f);
    const int rounds = 10, calls = count == 1 ? 50 : 5;
    time_calls(*off, x, calls);
    time_calls(*on, x, calls);
    std::vector<double> us[2];
    for (int round = 0; round < rounds; ++round) {
      for (int k = 0; k < 2; ++k) {
        const int mode = (round + k) % 2;  // off first in even rounds, on first in odd ones
        auto t = time_calls(mode ? *on : *off, x, calls);
        us[mode].insert(us[mode].end(), t.begin(), t.end());
      }
    }
    for (auto& u : us) std::sort(u.begin(), u.end());
    auto median = [](const std::vector<double>& u) { return u[u.size() / 2]; };
    if (off->rank() == 0) {
      std::printf("COST count=%zu calls=%zu off_median_us=%.1f on_median_us=%.1f ratio=%.2f "
                  "off_p10_us=%.1f on_p10_us=%.1f\n",
                  count, us[0].size(), median(us[0]), median(us[1]), median(us[1]) / median(us[0]),
                  us[0][us[0].size() / 10], us[1][us[1].size() / 10]);
    }
  }
  return 0;
}

const char* kind(const std::exception& e) {
  if (dynamic_cast<const CollectiveMismatchError*>(&e)) return "mismatch";
  if (dynamic_cast<const ddprun::TimeoutError*>(&e)) return "timeout";
  if (dynamic_cast<const ddprun::NetworkError*>(&e)) return "network";
  if (dynamic_cast<const ddprun::UsageError*>(&e)) return "usage";
  return "other";
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "count_mismatch") return count_mismatch();
    if (mode == "dtype_mismatch") return dtype_mismatch();
    if (mode == "reducer_mismatch") return reducer_mismatch();
    if (mode == "no_broadcast") return no_broadcast();
    if (mode == "no_finalize") return no_finalize();
    if (mode == "raise") return raise_on_rank1();
    if (mode == "stuck_outside") return stuck_outside();
    if (mode == "cost") return cost();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ERROR %s: %s\n", kind(e), e.what());
    return 3;
  }
  std::fprintf(stderr, "usage: mistakes_worker MODE (see the source)\n");
  return 2;
}
