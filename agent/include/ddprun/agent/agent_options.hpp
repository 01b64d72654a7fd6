#pragma once
// The agent's settings, with their defaults (what ddprun's flags set). How nodes meet is
// ddprun::rounds' RendezvousOptions: run id, node rank, nodes, backend.

#include <chrono>
#include <csignal>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ddprun/rounds/options.hpp"

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

// Where one local rank runs (--numa_binding): these CPUs (OS indexes), memory preferred on this
// NUMA node (OS index; -1: no memory policy).
struct CpuBinding {
  std::vector<int> cpus;
  int numa_node = -1;
};

// The exit code of a job ended by --max_same_failures: a crash loop, not worth requeueing.
constexpr int kCrashLoopExitCode = 93;

// Warm spares for Python workers (docs: Warm spares).
struct SpareOptions {
  bool on = false;
  std::string driver;                            // _ddprun_spare.py, beside the progress hook
  std::vector<std::string> preload = {"torch"};  // imported by each spare
  // --preload=auto: also what the last attempt's worker had imported at its first step (the
  // progress hook writes it to <heartbeat file>.modules when DDPRUN_PRELOAD_AUTO=1).
  bool preload_auto = false;
  // After a group's start, spares are made once every worker has beaten, or after this.
  std::chrono::milliseconds delay{std::chrono::seconds(3)};
};

struct AgentOptions {
  // The worker command (argv[0] resolved to a path); "${local_rank}" in any element is replaced.
  std::vector<std::string> command;
  int nproc_per_node = 1;

  std::string role = "default";

  int max_restarts = 0;
  // The same rank failing the same way (exit code or signal, or a hang) on this many consecutive
  // attempts ends the job with kCrashLoopExitCode instead of restarting again. 0 = off.
  int max_same_failures = 0;
  // Hangs (README: Hangs). --worker_timeout=auto (worker_timeout_auto, the default): a worker
  // that has done a step is suspect once silent for max(hang_floor, 5x its recent long steps);
  // --worker_timeout=S: once silent for S; 0: never. A suspect is reported (every rank's stack,
  // a verdict), and the group stopped hang_stop later (auto; S: at once) unless it beats again.
  bool worker_timeout_auto = true;
  std::chrono::milliseconds worker_timeout{0};
  // Before the first beat (S) or optimizer step (auto): the bound on the silence from the start.
  // 0 = no bound (auto's default: however long the first step takes).
  std::chrono::milliseconds worker_start_timeout{0};
  std::chrono::milliseconds hang_floor{std::chrono::seconds(30)};
  std::chrono::milliseconds hang_stop{std::chrono::seconds(120)};
  // Grace period between SIGTERM and SIGKILL when stopping workers.
  std::chrono::milliseconds stop_timeout{std::chrono::seconds(5)};
  // Before a hung group is stopped (or workers ignoring SIGTERM are killed), every running
  // worker's stack is collected, bounded by this. 0 = no stacks.
  std::chrono::milliseconds stack_dump_timeout{std::chrono::seconds(10)};
  // Signals forwarded to the workers (then the job ends with 128 + signal); also told to them
  // as TORCHELASTIC_SIGNALS_TO_HANDLE, as torchrun 2.x does.
  std::set<int> forward_signals = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  // ddprun's sitecustomize for Python workers, first on their PYTHONPATH (README: Hangs): it
  // touches DDPRUN_HEARTBEAT_FILE after every optimizer step and gives PyTorch 1.x its
  // NCCL_ASYNC_ERROR_HANDLING. Empty (--no_progress_hook, or not installed): neither; ddprun
  // then sets NCCL_ASYNC_ERROR_HANDLING itself (which PyTorch 2.x warns about on every rank).
  std::string python_site_dir;
  // True when ddprun starts the workers' Python itself (a .py script, -m) with the hook above:
  // the hook then sees torch's version, and sets NCCL_ASYNC_ERROR_HANDLING for PyTorch 1.x only.
  // Otherwise (--no_python, a program that is not a .py script, no hook) torch's version is
  // unknown, and ddprun sets both names, as torchrun 1.13 did, unless the user set either.
  bool hook_sees_torch = false;
  SpareOptions spares;
  // In-memory state (docs/usage.md: In-memory state): the node's budget for its local ranks'
  // state areas, in bytes, split evenly between them. -1: the default, a quarter of the memory
  // the agent may use (MemTotal, or its cgroup's memory.max if lower); 0: none (--no_state).
  long long state_memory = -1;
  // In a job of several nodes, the pace of the copies of this node's saved state to its buddy
  // node (docs/usage.md: State across nodes), in bytes a second; 0: none.
  long long state_copy_rate = 1LL << 30;

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
  // Lines of stdout / stderr holding any of these substrings are also written, prefixed, to
  // <run dir>/attempt_<n>/filtered_stdout.log / filtered_stderr.log (torchrun 2.x's filters).
  std::vector<std::string> duplicate_stdout_filters, duplicate_stderr_filters;

  // Each worker sees only its own GPU: LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES set to its device
  // (torchrun 2.x's --virtual-local-rank).
  bool virtual_local_rank = false;

  // /metrics, /healthz, /readyz over HTTP (README: Operating ddprun). port < 0: off; 0: a free
  // port; addr empty: every interface.
  struct Metrics {
    std::string addr;
    int port = -1;
  } metrics;

  // CPU and memory binding per local rank: "" (none), node, socket, exclusive, core-complex.
  std::string numa_binding;
  bool report_bindings = false;  // one line per local rank: its cores and NUMA node
  // Filled by the agent from numa_binding (tests may set it): by local rank.
  std::vector<CpuBinding> bindings;

  // How nodes meet: run id (TORCHELASTIC_RUN_ID), node rank, nodes, backend; for a single node,
  // where its workers' store listens. rdzv.nproc is nproc_per_node (the agent sets it).
  rounds::RendezvousOptions rdzv;

  // The environment workers inherit (before the variables the agent sets).
  std::map<std::string, std::string> base_env;
};

}  // namespace ddprun::agent
