#pragma once
// The sentinel's memory (guardian_sentinel.hpp), shared by the agent's side that starts it
// (guardian_sentinel.cpp) and the sentinel's own code (sentinel_main.cpp).

#include <climits>
#include <cstdint>
#include <sys/types.h>

namespace ddprun::agent::sentinel {

// Groups watched at once; an agent with more workers uses the forked guardian.
constexpr int kMaxGroups = 16384;

// Plain data above the sentinel's stack in its one mapping, left as mmap gave it (zeros) but for
// what the agent sets before the start: no constructor touches its pages.
struct State {
  // Set by the agent before the start.
  int fd;                   // the pipe's read end
  int write_fd;             // its write end (the agent's), closed by the sentinel
  int kill_fd;              // cgroup.kill, or -1
  std::int64_t promote_at;  // CLOCK_MONOTONIC ns (steady_clock's); < 0: never unasked
  const char* program;      // what it execs to become the guardian process (/proc/self/exe)
  char** envp;              // a copy of the agent's environment, in this mapping
  const char* containment;  // Containment::handover(), in this mapping
  std::uint32_t containment_bytes;
  // What it knows.
  pid_t groups[kMaxGroups];
  int ngroups;
  pid_t extra;              // a group that did not fit (until the guardian process has it)
  std::int32_t pending;     // guardian_protocol::Pending: what the guardian process must still do
  bool armed;
  std::int64_t deadline;
  std::uint32_t directory_bytes;
  char directory[PIPE_BUF];
  char handover_arg[64];
};

// The sentinel's body (clone's function): never returns.
int sentinel_main(void* state);

}  // namespace ddprun::agent::sentinel
