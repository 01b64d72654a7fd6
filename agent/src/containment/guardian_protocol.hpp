#pragma once
// What the agent tells its guardian (messages on a pipe), and what the guardian's first form,
// the sentinel, hands over to its second, the guardian process, when it becomes one by exec
// (guardian_sentinel.hpp).

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <sys/types.h>

namespace ddprun::agent::guardian_protocol {

// The messages' clock: steady_clock (CLOCK_MONOTONIC, which the sentinel reads itself), in
// nanoseconds.
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

// What the guardian process is to do first, before it reads the pipe on.
enum Pending : std::int32_t {
  kNothing = 0,
  kLapsed = 1,     // the fence's deadline passed: the job's processes killed (the groups are already)
  kAgentGone = 2,  // the pipe's end of file: kill everything, remove the cgroup and the directory
};

// The hand-over: this header, then `groups` pids, the directory's bytes and the containment's
// text (Containment::handover()), in a memfd whose number the guardian process gets in argv[1].
struct Handover {
  char magic[8];  // kMagic
  std::int32_t pipe_fd;
  std::int32_t pending;
  std::int32_t armed;
  std::int32_t groups;
  std::int64_t deadline;
  std::uint32_t directory_bytes;
  std::uint32_t containment_bytes;
};
inline constexpr char kMagic[8] = {'d', 'd', 'p', 'g', 'u', 'a', 'r', '1'};

// argv[1] of the guardian process: this, then the memfd's number.
inline constexpr char kGuardianFlag[] = "--ddprun-guardian-handover=";

}  // namespace ddprun::agent::guardian_protocol
