#pragma once
// State that outlives the worker (docs/usage.md: In-memory state): one memfd per local rank,
// made when the agent starts and kept until it ends, handed to every attempt's worker of that
// rank (cold or warm) as descriptor kStateFd. The worker's `ddprun.state` writes its committed
// training state there; the next attempt's worker maps it back.
//
// Each area is sized to its rank's share of the node's budget and sealed against growing and
// shrinking: a worker cannot take more memory than the budget, nor take the area away from the
// next attempt. tmpfs is sparse: pages never written cost nothing. A memfd is not bounded by
// /dev/shm's size (a container's is often 64 MB), and no other user can open it (/proc/PID/fd
// needs ptrace access to the agent or a worker).

#include <cstdint>
#include <string>
#include <vector>

#include "ddprun/agent/spawn.hpp"  // kStateFd

namespace ddprun::agent {

// --state_memory when not given: this share of the memory the agent may use (the smaller of
// MemTotal and its cgroup's memory.max). A save needs twice its size (two slots), and the
// workers need most of the node's memory for themselves.
constexpr double kDefaultStateShare = 0.25;

// The memory ddprun may use on this node: min(MemTotal, the agent's cgroup v2 memory.max), in
// bytes; 0 if neither can be read.
std::uint64_t usable_memory_bytes();

class StateAreas {
 public:
  // One area per local rank, each `budget_bytes / nproc` (rounded down to pages). Throws
  // ddprun::Error when a memfd cannot be made or sized (the message names the rank and size).
  StateAreas(int nproc, std::uint64_t budget_bytes);
  ~StateAreas();
  StateAreas(const StateAreas&) = delete;
  StateAreas& operator=(const StateAreas&) = delete;

  // The agent's descriptor of `local_rank`'s area (close-on-exec; spawn passes it as kStateFd).
  int fd(int local_rank) const;
  std::uint64_t bytes_per_rank() const { return per_rank_; }
  int ranks() const { return static_cast<int>(fds_.size()); }
  // The bytes the areas hold now (pages written), all ranks together.
  std::uint64_t resident_bytes() const;
  // The saves of round `round` of a job of several nodes are of a course of their own: each
  // area's next generation is at least round << kCourseShift (its header's latest raised), and
  // the ranks agree on a step and its course (docs/usage.md: One step for every rank). Every
  // node calls it as a round's workers are about to start; an area that cannot be written is
  // left (said), the others raised. Rounds from 2^22 on are not raised (the generations' room).
  void begin_course(int round) const;

 private:
  void release();
  std::vector<int> fds_;  // owned; constant after construction
  std::uint64_t per_rank_ = 0;
};

}  // namespace ddprun::agent
