// What a native trainer's in-memory save costs a step, side by side in one run (docs/benchmarks.md):
// ddprun::runtime::MemoryState::save (blocking) against save_async + wait() before the optimizer
// step, at --sizes MB of state, in one process with an area made here as ddprun's agent makes one.
// A step is --step_s seconds of "accelerator" time (a sleep, which leaves the CPU to the copy), then
// the optimizer step (one write to every page of the state). The stall is the time save() and
// wait() took; the copy's CPU time is a blocking save's time.
//
//   native_state_bench [--sizes 256,1024] [--steps 6] [--step_factor 10]
//
// --step_factor: a step is this many times the copy's time (measured first), the issue's "a step
// of at least 10x the copy's CPU time".
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/runtime/memory_state.hpp"

using namespace ddprun::runtime;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Result {
  double copy_s = 0, step_s = 0, blocking_stall = 0, async_stall = 0;
};

Result measure(std::size_t mb, int steps, double factor) {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t bytes = mb << 20, area = 2 * (bytes + 2 * page) + page;
  const int fd = ::memfd_create("ddprun-state-0", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(area)) != 0) {
    std::perror("memfd");
    std::exit(1);
  }
  ::setenv("DDPRUN_STATE_FD", std::to_string(fd).c_str(), 1);
  ::setenv("DDPRUN_STATE_BYTES", std::to_string(area).c_str(), 1);
  std::vector<unsigned char> state(bytes, 1);
  Result r;
  {
    MemoryState s;
    const std::vector<StateBuffer> buffers{{"state", state.data(), state.size()}};
    for (int i = 0; i < 2; ++i) s.save(i, buffers);  // both slots' pages made
    auto t = Clock::now();
    s.save(2, buffers);
    r.copy_s = since(t);
    r.step_s = factor * r.copy_s;
    auto optimizer_step = [&](int step) {
      for (std::size_t i = 0; i < bytes; i += page) state[i] = static_cast<unsigned char>(step);
    };
    for (int async = 0; async < 2; ++async) {
      double stall = 0;
      for (int step = 0; step < steps; ++step) {
        std::this_thread::sleep_for(std::chrono::duration<double>(r.step_s));  // forward and backward
        t = Clock::now();
        if (async) s.wait();  // the last save's copy, before the step changes the state
        stall += since(t);
        optimizer_step(step);
        t = Clock::now();
        if (async) {
          s.save_async(step, buffers);
        } else {
          s.save(step, buffers);
        }
        stall += since(t);
      }
      s.wait();
      (async ? r.async_stall : r.blocking_stall) = stall / steps;
    }
  }
  ::close(fd);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string sizes = "256,1024";
  int steps = 6;
  double factor = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--sizes") sizes = argv[i + 1];
    else if (k == "--steps") steps = std::max(1, std::atoi(argv[i + 1]));
    else if (k == "--step_factor") factor = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: native_state_bench [--sizes 256,1024] [--steps 6] [--step_factor 10]\n");
      return 2;
    }
  }
  std::printf("| state | copy (a blocking save) | step (%gx) | stall per step: save() | stall per step: save_async + wait() | ratio |\n",
              factor);
  std::printf("|---|---|---|---|---|---|\n");
  for (std::size_t at = 0; at < sizes.size();) {
    const std::size_t comma = std::min(sizes.find(',', at), sizes.size());
    const auto mb = static_cast<std::size_t>(std::stoul(sizes.substr(at, comma - at)));
    at = comma + 1;
    const Result r = measure(mb, steps, factor);
    std::printf("| %zu MB | %.3f s | %.2f s | %.1f ms (%.1f%%) | %.2f ms (%.2f%%) | %.0fx |\n", mb, r.copy_s, r.step_s,
                r.blocking_stall * 1e3, 100 * r.blocking_stall / r.step_s, r.async_stall * 1e3,
                100 * r.async_stall / r.step_s, r.blocking_stall / std::max(r.async_stall, 1e-6));
    std::fflush(stdout);
  }
  return 0;
}
