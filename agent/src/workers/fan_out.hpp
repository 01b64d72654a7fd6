#pragma once
// Bounded fan-out: --nproc_per_node checked against the process's limits before anything is
// forked, so that a number too large for them is refused at once (exit 2, naming the limit and
// what to do) instead of failing after thousands of workers have been started.

#include <cstdint>
#include <optional>
#include <string>

namespace ddprun::agent {

struct FanOutLimits {
  std::uint64_t open_files = 0;  // RLIMIT_NOFILE's soft limit (raised to the hard one when short)
  std::uint64_t processes = 0;   // RLIMIT_NPROC's soft limit; 0: not enforced (unlimited, or root)
};

// Descriptors the agent needs for `nproc` workers: what its store keeps for the agent (64, and 8
// a worker: pipes, log files) plus one store connection a worker.
std::uint64_t descriptors_needed(int nproc);

// Why `nproc` workers cannot run within `limits`, or nothing when they can. RLIMIT_NPROC counts
// threads, not processes: `agent_tasks` is the agent's own (its threads and its guardian).
std::optional<std::string> fan_out_refusal(int nproc, const FanOutLimits& limits, std::uint64_t agent_tasks = 2);

// The agent's threads and its guardian for `nproc` workers: the main thread, the guardian, the
// workers' store, the two console writers, the spawn threads, and with `metrics` the metrics server's, with `rendezvous`
// (several nodes) the rendezvous' three and a hosted store's.
std::uint64_t agent_tasks(int nproc, bool metrics, bool rendezvous);

// This process's limits (the soft open-file limit raised to the hard one first when it is short,
// as the agent's store does anyway); throws UsageError with fan_out_refusal's message.
void check_fan_out(int nproc, std::uint64_t agent_tasks = 2);

}  // namespace ddprun::agent
