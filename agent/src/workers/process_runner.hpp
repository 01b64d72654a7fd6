#pragma once
// The seam between the worker group and the operating system (as ninja's CommandRunner): starting
// a process, signalling its process group, collecting the ones that ended. The agent uses the
// real one; tests drive a WorkerGroup with a fake that starts nothing.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ddprun/agent/agent_options.hpp"
#include "ddprun/common/exit_status.hpp"
#include "containment/process_tree.hpp"

namespace ddprun::agent {

class Containment;
class Guardian;
class SpawnPool;

// A process as /proc shows it, read before ddprun sends it anything.
struct ProcSample {
  char state = '?';           // R S D T t Z; '?': unread (gone, or not this runner's to read)
  long long cpu_ns = -1;      // its main thread's time on a CPU (/proc/PID/schedstat), in ns
  long long busy_ns = -1;     // the same plus its time waiting for a CPU: running or runnable
  unsigned long long caught = 0;  // SigCgt: bit (sig - 1) set when the process handles sig
  bool catches(int sig) const { return sig > 0 && sig <= 64 && (caught >> (sig - 1) & 1ULL); }
};

class ProcessRunner {
 public:
  struct Started {
    pid_t pid = -1;      // also its process group id
    int stdout_fd = -1;  // pipes the worker writes; -1: none
    int stderr_fd = -1;
  };
  struct Ended {
    pid_t pid = -1;
    ExitStatus status;
  };

  struct Request {
    const std::vector<std::string>* argv;
    const std::vector<std::string>* env;
    const CpuBinding* binding;
    int state_fd = -1;  // its local rank's state area (state_areas.hpp); -1: none
  };

  virtual ~ProcessRunner() = default;
  // Starts `argv` with exactly `env` ("K=V"), with `state_fd` (the agent's, not given away) as
  // its descriptor kStateFd unless -1. Throws ddprun::Error.
  virtual Started start(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                        const CpuBinding* binding, int state_fd) = 0;
  // Starts a warm spare as start() starts a worker (the same containment), with `order_fd` and
  // `ready_fd` as its descriptors 3 and 4 (and `state_fd` as kStateFd, as start()). Until it is forgotten or runs a worker
  // (spare_runs_worker), a sweep spares it. Throws ddprun::Error (this one: not supported).
  virtual Started start_spare(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                              const CpuBinding* binding, int order_fd, int ready_fd, int state_fd);
  // Starts every request, as start() each; `started` gets one entry a request, in order (pid -1:
  // not started). Returns the first failure's message, empty when all started. This one starts
  // them in order and stops at the first failure; the real runner may start them in parallel.
  virtual std::string start_all(const std::vector<Request>& requests, std::vector<Started>& started);
  // Sends `sig` to the process group `pgid`.
  virtual void signal_group(pid_t pgid, int sig) = 0;
  // The children that ended since the last call (never blocks). May include processes that are
  // not workers: the caller ignores them.
  virtual std::vector<Ended> reap() = 0;
  // The groups `pgids`, just started, are to be killed if the agent dies (one message for a whole
  // worker group: the watcher is woken once, not once a worker).
  virtual void watch(const std::vector<pid_t>& pgids) { (void)pgids; }
  // The process group `pgid` is gone (reaped and killed): nothing needs to watch it any more.
  virtual void forget(pid_t pgid) = 0;
  // The warm spare `pid` (start_spare) runs a worker now: a sweep kills it like any worker.
  virtual void spare_runs_worker(pid_t pid) { (void)pid; }
  // The native stack of a running process, as text, within `limit` (called off the loop).
  virtual std::string native_stack(pid_t pid, std::chrono::milliseconds limit) = 0;
  // Where each worker's stack is read (by the workers' pids, in their order): the Python
  // processes below it, else the process running its program (README: Where every rank is stuck).
  virtual std::vector<StackTargets> stack_targets(const std::vector<pid_t>& workers) = 0;
  // Sends `sig` to the one process `pid` (not its group).
  virtual void signal_process(pid_t pid, int sig) = 0;
  // Sends `sig` to the main thread of `pid` (which then handles it: faulthandler's "Current
  // thread" is the main one).
  virtual void signal_main_thread(pid_t pid, int sig) { signal_process(pid, sig); }
  // `pid`'s state, CPU time and handled signals (/proc/PID/stat and status).
  virtual ProcSample sample(pid_t pid) { (void)pid; return {}; }
  // Every worker ended: kills what they left running; returns "PID (name)" of each.
  virtual std::vector<std::string> sweep() { return {}; }

 protected:
  // start() for each request, the calls made by `run(n, one)` (one(i) for i < n, in any order
  // or at once): what start_all returns, the first failure kept and nothing started after it.
  std::string start_each(const std::vector<Request>& requests, std::vector<Started>& started,
                         const std::function<void(std::size_t, const std::function<void(std::size_t)>&)>& run);
};

// clone + exec (spawn_process), kill(2), waitpid(2); the groups it is told to watch are reported
// to the guardian, which kills them if the agent dies without stopping them; every worker is
// born in the job's containment (containment.hpp).
class RealProcessRunner : public ProcessRunner {
 public:
  RealProcessRunner(Guardian& guardian, const Containment& containment);
  ~RealProcessRunner() override;
  Started start(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                const CpuBinding* binding, int state_fd) override;
  std::string start_all(const std::vector<Request>& requests, std::vector<Started>& started) override;
  Started start_spare(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                      const CpuBinding* binding, int order_fd, int ready_fd, int state_fd) override;
  void signal_group(pid_t pgid, int sig) override;
  std::vector<Ended> reap() override;
  void watch(const std::vector<pid_t>& pgids) override;
  void forget(pid_t pgid) override;
  std::string native_stack(pid_t pid, std::chrono::milliseconds limit) override;
  std::vector<StackTargets> stack_targets(const std::vector<pid_t>& workers) override;
  void signal_process(pid_t pid, int sig) override;
  void signal_main_thread(pid_t pid, int sig) override;
  ProcSample sample(pid_t pid) override;
  void spare_runs_worker(pid_t pid) override;
  std::vector<std::string> sweep() override;

 private:
  Guardian& guardian_;
  const Containment& containment_;
  // The warm spares started and not yet forgotten or handed a worker: passed to each sweep,
  // with the stack readers running (observe/agent_helpers.hpp), as the pids it must exempt.
  std::mutex spares_mu_;
  std::set<pid_t> spares_;
  std::unique_ptr<SpawnPool> pool_;  // threads that start workers beside the loop's, made at need
};

}  // namespace ddprun::agent
