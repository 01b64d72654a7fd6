#pragma once
// What the agent tells its guardian: fixed-size messages on a pipe (the guardian's descriptor 3),
// and how the guardian process is started (guardian.hpp).

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <sys/types.h>

namespace ddprun::agent::guardian_protocol {

// The messages' clock: steady_clock (CLOCK_MONOTONIC), in nanoseconds.
inline std::int64_t steady_ns(std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now()) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

struct Message {
  char op;  // 'w' watch, 'f' forget, 'a' arm, 'd' disarm, 'q' quit quietly, 'p' the agent's
            // temporary directory (its path's `when` bytes follow)
  pid_t pgid;
  std::int64_t when;  // 'a': the deadline, steady clock nanoseconds
  std::int64_t sent;  // when the agent sent it (same clock)
};

// The most one write sends: whole messages, at most PIPE_BUF bytes (atomic).
constexpr std::size_t kChunk = PIPE_BUF / sizeof(Message) * sizeof(Message);

// The guardian process: the running program (/proc/self/exe) started as
//   ddprun-guard --ddprun-guardian TOKEN CGROUP OWNER
// with the pipe's read end as descriptor 3 (guardian_main.hpp).
inline constexpr int kPipeFd = 3;
inline constexpr char kGuardianFlag[] = "--ddprun-guardian";

}  // namespace ddprun::agent::guardian_protocol
