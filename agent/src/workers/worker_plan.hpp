#pragma once
// What each local rank runs in a round: its command, torchrun's environment, where its output
// goes, its files (TORCHELASTIC_ERROR_FILE, DDPRUN_HEARTBEAT_FILE).

#include <vector>

#include "ddprun/agent/agent_options.hpp"
#include "ddprun/rounds/rendezvous.hpp"
#include "containment/run_dir.hpp"
#include "workers/worker_group.hpp"

namespace ddprun::agent {

class StateAreas;

// Creates the workers' directories. Throws ddprun::Error. `state`: each local rank's state area,
// passed to its worker as DDPRUN_STATE_FD (with its size, DDPRUN_STATE_BYTES); nullptr: none.
std::vector<WorkerSpec> plan_workers(const AgentOptions& opt, const rounds::RoundInfo& round, const RunDir& dir,
                                     const StateAreas* state = nullptr);

}  // namespace ddprun::agent
