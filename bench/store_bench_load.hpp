#pragma once
// store_bench: the load generator. One thread, one epoll set, closed loop.
//
//   throughput: N connections (one request in flight each) cycling through SET k, GET k (sent
//               together: SET has no reply) and ADD counter; ops/s counts requests (3 per
//               cycle); latency per reply: SET+GET and ADD.
//   barrier:    N clients connect, each ADDs a counter, the one that reaches N SETs a key, all
//               WAIT for it; time from the first connect to the last release.

#include <cstdint>

#include "store_bench_server.hpp"

namespace store_bench {

struct Percentiles {
  double p50 = 0, p99 = 0;  // microseconds
};

struct ThroughputResult {
  double ops_per_s = 0;
  double server_us_per_op = 0;  // server CPU time per request: efficiency, whatever the client costs
  Percentiles setget, add;
};

// `duration` seconds measured after a 300 ms warm-up; `run` keeps each point's keys apart.
// Throws std::runtime_error when the server stops answering for 5 s or closes a connection.
ThroughputResult throughput(const Server& server, int nconns, double duration, int run);

struct BarrierResult {
  double connect_s = 0, total_s = 0;
  std::string error;  // why it did not complete; empty when it did
};

// `error` says why when nothing happens for 30 s, the server closes a connection, or the barrier
// takes longer than limit_s.
BarrierResult barrier(std::uint16_t port, int n, int run, double limit_s);

}  // namespace store_bench
