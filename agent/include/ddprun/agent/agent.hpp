#pragma once
// The per-node agent: hosts the rendezvous store, spawns one worker per local rank with
// torchrun's environment, watches them (event-driven: a death is seen when it happens), tears the
// group down on the first failure or hang and restarts it while restarts remain.
//
// Guarantees: every worker leads its own process group and dies with the agent (parent-death
// signal, and a guardian process that kills the groups if the agent is SIGKILLed or OOM-killed);
// console lines from different workers never interleave within a line; the exit code is the
// root-cause worker's (128 + signal when killed).

#include <chrono>
#include <csignal>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace ddprun::agent {

// Which of a worker's streams go to files: 0 none, 1 stdout, 2 stderr, 3 both (torchrun's
// --redirects / --tee values), with optional per-local-rank values ("0:1,1:2").
struct StreamSelection {
  int all = 0;
  std::map<int, int> per_rank;
  int for_rank(int local_rank) const {
    auto it = per_rank.find(local_rank);
    return it == per_rank.end() ? all : it->second;
  }
  bool any() const { return all != 0 || !per_rank.empty(); }
};

// Multi-node rendezvous of agents (torchrun's static and c10d backends).
struct RendezvousOptions {
  bool enabled = false;          // more than one node: rendezvous through a shared store
  bool dynamic = false;          // c10d (elastic MIN:MAX, join order) vs static (fixed nodes, node_rank)
  int min_nodes = 1;
  int max_nodes = 1;
  // The rendezvous store every agent connects to (--rdzv_endpoint, or --master_addr:port).
  std::string endpoint_host = "127.0.0.1";
  std::uint16_t endpoint_port = 29400;
  int is_host = -1;              // -1: auto (the endpoint is one of this machine's addresses and
                                 // its port is free), 0: never, 1: always
  std::string local_addr;        // how other nodes see this one (reported in summaries)
  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};
  std::chrono::milliseconds close_timeout{std::chrono::seconds(30)};
  std::chrono::milliseconds keep_alive_interval{std::chrono::seconds(5)};
  int keep_alive_max_attempt = 3;
  std::chrono::milliseconds read_timeout{std::chrono::seconds(60)};
  // --rdzv_backend=etcd: nodes meet through an etcd v3 cluster (no agent hosts a rendezvous
  // store; the workers' store is hosted by group rank 0 of each round).
  bool etcd = false;
  std::string etcd_endpoints;                   // "h1:2379,h2:2379,..."
  std::string etcd_prefix = "/ddprun";          // keys under <prefix>/<run_id>/
  std::chrono::seconds lease_ttl{5};            // a node silent this long is lost
  std::string etcd_user, etcd_password;
  // The per-job secret (--rdzv_conf=secret_file=PATH or DDPRUN_SECRET_FILE): agents and the
  // rendezvous store authenticate each other with it. Empty: the store accepts any client.
  std::string secret;
};

// Where one local rank runs (--numa_binding): these CPUs (OS indexes), memory preferred on this
// NUMA node (OS index; -1: no memory policy).
struct CpuBinding {
  std::vector<int> cpus;
  int numa_node = -1;
};

struct AgentOptions {
  // The worker command (argv[0] resolved to a path); "${local_rank}" in any element is replaced.
  std::vector<std::string> command;
  int nproc_per_node = 1;

  std::string role = "default";
  std::string run_id = "none";
  int node_rank = 0;  // GROUP_RANK
  int nnodes = 1;     // GROUP_WORLD_SIZE

  // The store the agent hosts: bound before any worker is told about it. Port 0 = a free port.
  std::string store_host = "127.0.0.1";
  std::uint16_t store_port = 29500;

  int max_restarts = 0;
  // A worker that has not touched DDPRUN_HEARTBEAT_FILE for this long is failed. 0 = off.
  std::chrono::milliseconds worker_timeout{0};
  // Grace period between SIGTERM and SIGKILL when stopping workers.
  std::chrono::milliseconds stop_timeout{std::chrono::seconds(5)};
  // Before a hung group is stopped (or workers ignoring SIGTERM are killed), every running
  // worker's stack is collected, bounded by this. 0 = no stacks.
  std::chrono::milliseconds stack_dump_timeout{std::chrono::seconds(10)};
  // Signals forwarded to the workers (then the job ends with 128 + signal).
  std::set<int> forward_signals = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};

  StreamSelection redirects;  // to files only
  StreamSelection tee;        // to files and the console
  // Root of per-rank logs and error files: <log_dir>/<run_id>/attempt_<n>/<local_rank>/.
  // Empty: a temporary directory, removed at exit unless it holds logs.
  std::string log_dir;
  std::set<int> local_ranks_filter;  // local ranks whose output reaches the console; empty = all
  // Machine-readable events, JSON Lines (README: Event log); empty = none.
  std::string events_file;
  // Console line prefix; ${role_name}, ${local_rank} and ${rank} are replaced.
  std::string line_prefix_template = "[${role_name}${local_rank}]:";

  // CPU and memory binding per local rank: "" (none), node, socket, exclusive, core-complex.
  std::string numa_binding;
  bool report_bindings = false;  // one line per local rank: its cores and NUMA node
  // Filled by the agent from numa_binding (tests may set it): by local rank.
  std::vector<CpuBinding> bindings;

  // Multi-node: how agents find each other. When enabled, store_host/store_port are unused.
  RendezvousOptions rdzv;

  // The environment workers inherit (before the variables the agent sets).
  std::map<std::string, std::string> base_env;
};

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
