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
// rdzv_endpoint, rdzv_id), and the variable each came from: the step's node count and host list
// (SLURM_STEP_NUM_NODES, SLURM_STEP_NODELIST; outside srun the job's), SLURM_NODEID, and the job
// id with its requeue count and step number. A value Slurm gives wrongly (a malformed host list,
// a count the list disagrees with) is a problem of the options it would set: the caller raises
// it only for an option it takes from Slurm, since an explicit flag stands in for it.
struct SlurmStep {
  std::map<std::string, std::string> values;
  std::map<std::string, std::string> from;      // option -> SLURM_ variable
  std::map<std::string, std::string> problems;  // option -> what is wrong (the caller says which flags to give)
};
// nullopt outside a Slurm step (SLURM_JOB_ID, a node count, SLURM_NODEID and a host list).
std::optional<SlurmStep> slurm_step(const std::map<std::string, std::string>& env);

}  // namespace ddprun::launcher
