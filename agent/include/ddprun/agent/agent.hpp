#pragma once
// The per-node agent: spawns one worker per local rank with torchrun's environment, watches them
// (event-driven: a death is seen when it happens), tears the group down on the first failure or
// hang and restarts it while restarts remain; across nodes it meets the others round after round
// (ddprun::rounds).
//
// Guarantees: every worker leads its own process group and dies with the agent (parent-death
// signal, and a guardian process that kills the groups if the agent is SIGKILLed or OOM-killed,
// or when this node's liveness lapses: see Fence in ddprun/rounds/rendezvous.hpp); console lines
// from different workers never interleave within a line; the exit code is the root-cause
// worker's (128 + signal when killed).

#include <memory>

#include "ddprun/agent/agent_options.hpp"

namespace ddprun::agent {

class Agent {
 public:
  // Forks the guardian process at once: construct before starting any thread.
  explicit Agent(AgentOptions options);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs the job to its end and returns ddprun's exit code: 0 when every worker of an attempt
  // exited 0; else the root cause's exit code (128 + signal if killed), 124 for a heartbeat
  // time-out, 128 + signal when ddprun itself was told to stop. Throws ddprun::Error when the
  // job cannot start (the store's address is in use, the log directory cannot be made).
  int run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
