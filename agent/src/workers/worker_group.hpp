#pragma once
// One node's worker processes for one attempt: started through a ProcessRunner, their output
// read from pipes (event-driven, on the agent's loop), reaped on SIGCHLD, stopped (SIGTERM, then
// SIGKILL after stop_timeout), watched for heartbeats. The group decides nothing: it tells its
// listener what happened (a worker failed or hung; every worker is gone and its output drained),
// and the JobController decides what follows.

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/common/exit_status.hpp"
#include <map>
#include <optional>

#include "ddprun/agent/agent_options.hpp"
#include "observe/hang_verdict.hpp"
#include "observe/stack_dump.hpp"
#include "workers/heartbeat.hpp"
#include "workers/output.hpp"
#include "workers/spares.hpp"

namespace boost::asio {
class io_context;
}

namespace ddprun::agent {

class ProcessRunner;

// What the controller asks for one worker.
struct WorkerSpec {
  int local_rank = 0;
  int rank = 0;
  std::vector<std::string> argv;
  std::vector<std::string> env;  // "K=V", complete
  std::string dir;               // LOG_DIR/RUN_ID/attempt_N/LOCAL_RANK (stack.txt goes there)
  std::string error_file;        // TORCHELASTIC_ERROR_FILE
  std::string heartbeat_file;    // DDPRUN_HEARTBEAT_FILE; empty: not watched
  StreamRoute out, err;
  std::optional<CpuBinding> binding;  // --numa_binding
  int state_fd = -1;  // the agent's descriptor of its local rank's state area (not owned); -1: none
};

// A worker's life, as its group sees it.
enum class Life { not_started, running, ended };
// What a worker's end means; only ever raised (own < stopped < reported).
enum class Standing {
  own,       // its end is its own doing: a failure when unsuccessful
  stopped,   // ddprun told it to stop: its end is a consequence, not a cause
  reported,  // its failure (a hang, or its end) was reported: not reported again
};

struct Worker {
  WorkerSpec spec;
  pid_t pid = -1;
  Life life = Life::not_started;
  Standing standing = Standing::own;
  ExitStatus status;
  std::chrono::system_clock::time_point started_wall, ended_wall;
  double silent_s = 0;  // found hung: seconds since its last heartbeat (or its start, before the first)
  // Its pace (README: Hangs, stragglers): the share of a core its main thread used over the last
  // window while it made steps (-1: unknown), and whether it is a straggler.
  double busy = -1;
  bool straggler = false;

  bool running() const { return life == Life::running; }
  bool stopped_by_agent() const { return standing == Standing::stopped; }
  void raise(Standing s) { standing = std::max(standing, s); }
};

// A hang's report (README: Hangs): every running rank as read when one was found silent, before
// the group is stopped.
struct HangReport {
  int rank = -1;           // the silent rank that started it (its heartbeat lapsed first)
  std::string reason;      // why it is suspect ("no progress for 31.0 s ...")
  double silent_s = 0;
  std::vector<RankView> ranks;  // host left empty: the controller knows its node's name
  std::vector<std::string> files;  // stack.txt of each rank read
  std::chrono::milliseconds stop_in{0};  // the group is stopped this long after the report
};

// The signal on which the progress hook writes a Python worker's stacks (DDPRUN_STACK_SIGNAL): a
// real-time one, SIGRTMIN + 6, which neither PyTorch nor Python's runtime uses.
int stack_signal();

// Why a worker is reported failed (the event log's "reason").
enum class FailureKind { exit, signal, hang, oom };
const char* to_string(FailureKind k);

class WorkerGroup {
 public:
  // Called on the loop thread.
  struct Listener {
    virtual ~Listener() = default;
    // A worker ended unsuccessfully (`code`: ddprun's exit code for it), or hung (it still runs).
    virtual void on_worker_failed(const Worker& w, const std::string& reason, int code, FailureKind kind) = 0;
    // Every worker of the group ended and its output is drained (bounded: 2 s after the last
    // exit, for a grandchild that escaped the process group and holds a pipe).
    virtual void on_group_ended() = 0;
    // The stacks of the workers that were running, by rank (their full dumps in each worker's
    // stack.txt), collected before a hung group was stopped or SIGKILLed.
    virtual void on_stacks_dumped(const std::map<int, std::vector<StackFrame>>& by_rank,
                                  const std::vector<std::string>& files) = 0;
    // A worker was found silent: every running rank's state and stacks, read without stopping
    // them. The group is stopped (on_worker_failed, a hang) report.stop_in later unless the
    // silent worker makes progress again, which on_hang_cleared tells.
    virtual void on_hang_report(const HangReport& report) { (void)report; }
    virtual void on_hang_cleared(int rank, double after_s) { (void)rank, (void)after_s; }
    // A worker much busier than the node's others, window after window, while all make steps:
    // the others wait for it in each collective.
    virtual void on_straggler(const Worker& w, double busy, double others) { (void)w, (void)busy, (void)others; }
    // Each pace window (the hang floor, at least 1 s): the share of a core each rank's main
    // thread used, of the ranks that made steps in it (for the job's stragglers across nodes).
    virtual void on_pace(const std::map<int, double>& busy) { (void)busy; }
    // Across nodes: a rank of this node is in torch.save now (told at each check while it is).
    virtual void on_saving() {}
    // Across nodes, before a silent rank is reported: whether a rank of another node is saving
    // (then the silence is its wait, not a hang); nullopt while the answer is being fetched (the
    // next check asks again).
    virtual std::optional<bool> others_saving() { return false; }
  };
  struct Options {
    HangRule hang;  // heartbeats (heartbeat.hpp); off by default
    // --worker_timeout=auto: from a hang's report to the group's stop (0: at once).
    std::chrono::milliseconds hang_stop{0};
    std::chrono::milliseconds stop_timeout{std::chrono::seconds(5)};
    std::chrono::milliseconds stack_dump_timeout{std::chrono::seconds(10)};  // 0: no stacks
    // The signal on which the progress hook's faulthandler writes a Python worker's stacks to
    // HEARTBEAT.stack (0: none). Sent only to a process that catches it (/proc: SigCgt).
    int stack_signal = 0;
    // Which of these processes a GPU still holds memory for (NVML); empty where there is no
    // GPU. A group with a worker that did not exit 0 ends (and so restarts) only once none is
    // held, or gpu_release_timeout later, so that the next attempt finds its memory free.
    std::function<std::vector<pid_t>(const std::vector<pid_t>&)> gpu_holders;
    std::chrono::milliseconds gpu_release_timeout{std::chrono::seconds(30)};
    SpareOptions spares;  // warm spares for Python workers (spares.hpp); off by default
    // The agent's options as the group takes them (hang rule, stops, stacks, spares).
    static Options from(const AgentOptions& agent);
  };

  WorkerGroup(boost::asio::io_context& io, ProcessRunner& runner, Options options);
  void set_listener(Listener& listener);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts a new group (the previous one must have ended). Throws ddprun::Error; workers already
  // started are then killed.
  void start(std::vector<WorkerSpec> specs);
  // SIGCHLD: collects every ended child and reports what it means.
  void reap();
  // Stops every running worker with `sig` (SIGKILL to each one still running stop_timeout later,
  // after collecting their stacks). Stacks::first: a hang; collect every running worker's stack
  // (bounded by stack_dump_timeout), then stop.
  enum class Stacks { after_timeout, first };
  void stop(int sig, Stacks stacks = Stacks::after_timeout);
  // SIGKILL to every running worker, now.
  void kill_now();
  // Passes `sig` on to every running worker without stopping the group (SIGUSR1, ...).
  void forward(int sig);
  // The round's nodes (1 by default). A rank in torch.save pauses the hang watch on its node and,
  // across nodes, on every node that asks (Listener::others_saving) before it reports a silence.
  void set_nodes(int nodes);
  // Whether the next start()'s group makes warm spares (where spares are on): not where no
  // restart can follow it (a single node at its last allowed restart).
  void set_spares_wanted(bool wanted);
  // Checks the heartbeat files (the group's timer calls this; tests call it with their own clock).
  void check_heartbeats(std::chrono::steady_clock::time_point now);
  // Calls `ready` once every worker of the current group has touched its heartbeat file once
  // (looked at every 5% of the time since this call, clamped to 5 ms - 1 s: first_beat_look in
  // heartbeat.hpp; whatever --worker_timeout; never for a group that stops first).
  void watch_first_beats(std::function<void()> ready);

  // How many workers of the current group were handed to warm spares (not started cold).
  int warm_started() const;
  // The warm spares waiting (count, ready, memory); all of them killed (the job ends).
  int spares_waiting() const;
  int spares_ready() const;
  long long spares_memory_bytes() const;
  void discard_spares();
  // Spares for these workers now, with no group running (a node waiting for a place in the job:
  // its workers of the round it will join, their per-rank variables to be sent at hand-over).
  void make_spares(const std::vector<WorkerSpec>& specs);
  bool stopping() const;
  boost::asio::io_context& loop() const;  // the agent's loop, which the group runs on
  bool ended() const;  // every worker reaped and drained (true before the first start)
  std::vector<Worker> workers() const;  // a copy, as they are now
  // Log files that could not take all their output (a full disk), from groups ended since the
  // last call.
  std::vector<StreamOutput::FileLoss> take_log_losses();
  // How each local rank's worker last ended, across groups: (rank, exit code for a shell).
  const std::map<int, std::pair<int, int>>& last_exits() const;
  // The last stderr lines of a worker of the current group (a Python dump's frames of the warm
  // spare driver left out: stack_dump.hpp).
  std::deque<std::string> stderr_tail(int local_rank) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
