#pragma once
// The rendezvous flags together: where the store is (or which etcd), how nodes meet, the
// --rdzv_conf keys of each backend.

#include <map>
#include <string>

#include "ddprun/agent/agent_options.hpp"
#include "option_table.hpp"

namespace ddprun::launcher {

// Fills a.rdzv: run id (random with --standalone), nodes, backend, where the store is.
// Throws UsageError.
void place_store(const Settings& s, const std::map<std::string, std::string>& env, agent::AgentOptions& a);

}  // namespace ddprun::launcher
