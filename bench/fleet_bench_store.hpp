#pragma once
// fleet_bench's store process: a `ddprun-store --count_requests` started on a free port, its
// tally of requests (SIGUSR1: so far; SIGTERM: at exit) and its CPU time from /proc.

#include <sys/types.h>

#include <cstdio>
#include <string>

namespace fleet {

struct Store {
  pid_t pid = -1;
  FILE* out = nullptr;  // its stdout
  std::string port;
};

// Listening on every interface (127.0.0.1, .2, ... reach it), loopback clients only.
Store start_store(const std::string& bin);

// The store's tally: requests in all, keep-alive ADDs (r<R>/alive/<g>), bytes in and out, WAITs woken.
struct Tally {
  double requests = 0, alive = 0, bytes_in = 0, bytes_out = 0, woken = 0;
  Tally operator-(const Tally& o) const {
    return {requests - o.requests, alive - o.alive, bytes_in - o.bytes_in, bytes_out - o.bytes_out, woken - o.woken};
  }
};

// Sends `signal` (SIGUSR1, or SIGTERM at the end) and reads the tally the store prints.
Tally read_tally(Store& s, int signal);

// The store process's CPU: every thread's run time (schedstat, ns) and utime+stime, utime (ticks).
struct Cpu {
  double run_s = 0, ticks_s = 0, user_s = 0;
  Cpu operator-(const Cpu& o) const { return {run_s - o.run_s, ticks_s - o.ticks_s, user_s - o.user_s}; }
};
Cpu cpu_of(pid_t pid);

}  // namespace fleet
