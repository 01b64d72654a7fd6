#pragma once
// fleet_bench's etcd cluster: 3 members on loopback (data in a temporary directory, as
// bench/rdzv_bench.py starts them), their CPU (the 3 processes summed) and their requests, watch
// events and bytes, scraped from each member's /metrics and summed.

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "fleet_bench_store.hpp"

namespace fleet {

struct Etcd {
  std::vector<pid_t> pids;
  std::vector<int> client_ports;
  std::string endpoints;  // "127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"
  std::string dir;
};

// Starts the 3 members (etcd's own heartbeat and election timeout, 100 ms and 1 s; data in a new
// directory under `under`: a disk, or a tmpfs such as /dev/shm that takes the disk's fsync out of
// what is measured) and waits until one answers a put. Throws when they do not come up.
Etcd start_etcd(const std::string& bin, const std::string& under = "/tmp");
// SIGTERM to each member, waited for; the data directory removed.
void stop_etcd(Etcd& e);

// Summed over the members: requests (gRPC messages received, the JSON gateway's included),
// `alive`: of which lease keep-alives, `woken`: watch events sent, bytes in and out (the
// members' gRPC client traffic). `by_kind`: requests by gRPC method.
Tally etcd_tally(const Etcd& e, std::map<std::string, double>* by_kind = nullptr);
// The members' CPU, summed.
Cpu etcd_cpu(const Etcd& e);

}  // namespace fleet
