#pragma once
// Running inside a Slurm step without glue: Slurm's host lists, and the multi-node settings a
// step implies (nodes, this node's rank, the first host as the master, the job id as run id).

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::launcher {

// Expands a Slurm host list: "node[01-04,07],gpu-a[1-2]" -> node01 node02 node03 node04 node07
// gpu-a1 gpu-a2; several bracket groups in one name multiply ("r[1-2]n[1-2]"); zero padding is
// kept. Throws UsageError for a malformed list or one of more than `limit` hosts.
std::vector<std::string> expand_hostlist(const std::string& list, std::size_t limit = 100000);

// The settings a Slurm step implies, by option name (nnodes, node_rank, master_addr,
// rdzv_endpoint, rdzv_id),
// when SLURM_JOB_ID, SLURM_NNODES (or SLURM_JOB_NUM_NODES), SLURM_NODEID and SLURM_JOB_NODELIST
// (or SLURM_NODELIST) are set; nullopt outside Slurm. Throws UsageError for malformed values.
std::optional<std::map<std::string, std::string>> slurm_defaults(const std::map<std::string, std::string>& env);

}  // namespace ddprun::launcher
