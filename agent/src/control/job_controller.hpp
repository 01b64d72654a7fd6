#pragma once
// The job's state machine: every decision of the agent is taken here (when to start, stop and
// restart workers, which failure is the root cause, what ddprun exits with), on the loop thread,
// from events of the WorkerGroup, the Rendezvous and the signals ddprun receives. The controller
// does no I/O of its own beyond logging: it can be driven entirely in-process by tests.
//
// Phases and transitions (the only place they are decided):
//
//   rendezvous --round ready---------------------------------> running   (workers started)
//   rendezvous --rendezvous failed---------------------------> done      (its exit code)
//   rendezvous --stop signal---------------------------------> draining  (the others are told; 128+sig)
//   rendezvous --waiting for a place (beyond MAX)------------> rendezvous (warm spares made for the workers)
//   running    --a worker failed or hung (the root cause)----> stopping  (round ended "failure", group stopped)
//   running    --round over (another node, lost store, ...)-> stopping  (group stopped)
//   running    --stop signal---------------------------------> stopping  (round ended "stopped", signal passed on)
//   running    --every worker exited 0-----------------------> stopping  (success reported; waits for every node)
//   stopping   --group ended and round outcome known---------> decide():
//                 success                         -> draining (0)
//                 stopped                         -> draining (128 + signal)
//                 failure, restarts left          -> rendezvous (next round, restart count + 1)
//                 failure, no restart left        -> draining (the root cause's code; summary printed)
//                 failure, a crash loop           -> draining (93; summary printed): --max_same_failures
//                 node lost, a node joining       -> rendezvous (next round, same restart count)
//                 rendezvous lost, malformed end  -> draining (1, nothing acknowledged)
//   running    --workers SIGKILLed after this node's liveness lapsed (fenced)
//                                                     -> stopping  (round ended "node lost": this one)
//                 any of these after a stop signal -> draining (128 + signal; the next round is told)
//   draining   --rendezvous finished-------------------------> done
//   any phase  --second SIGINT/SIGTERM-----------------------> workers SIGKILLed now (draining: done now)

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/agent/agent_options.hpp"
#include "ddprun/rounds/rendezvous.hpp"
#include "containment/fence_state.hpp"
#include "control/hang_exchange.hpp"
#include "control/pace_exchange.hpp"
#include "control/saving_exchange.hpp"
#include "control/store_queue.hpp"
#include "control/recovery_clock.hpp"
#include "observe/failure_report.hpp"
#include "observe/pace_judge.hpp"
#include "workers/worker_group.hpp"

namespace ddprun::agent {

class EventLog;
class RunDir;
class StateAreas;
class StateCopies;
using rounds::Rendezvous;
using rounds::RendezvousFailure;
using rounds::RoundEnd;
using rounds::RoundInfo;
using rounds::RoundOutcome;

enum class Phase { rendezvous, running, stopping, draining, done };
const char* to_string(Phase p);

class JobController : public WorkerGroup::Listener, public Rendezvous::Listener {
 public:
  // `node_name`: how the other nodes know this one (failure summaries).
  JobController(const AgentOptions& opt, WorkerGroup& group, Rendezvous& rdzv, EventLog& events, RunDir& dir,
                std::string node_name, FenceState* fence = nullptr, const StateAreas* state = nullptr);

  void start();             // joins the first round
  void on_signal(int sig);  // a signal ddprun handles, SIGCHLD excepted (that one goes to the group)
  // Copies of the workers' state across nodes: each round of several nodes puts each rank's state
  // in place before its workers start (`post` runs a function on the loop, from any thread).
  void use_state_copies(StateCopies* copies, std::function<void(std::function<void()>)> post);

  Phase phase() const { return phase_; }
  int exit_code() const { return exit_code_; }
  int round() const { return round_; }
  int restart_count() const { return attempt_; }
  int restarts() const { return restarts_; }  // restarts this agent decided (a failure each)
  double last_rendezvous_seconds() const { return rendezvous_s_; }  // joining to round ready
  double last_start_seconds() const { return start_s_; }           // round ready to every worker spawned
  const std::vector<RecoveryTimes>& recoveries() const { return clock_.completed(); }

  // WorkerGroup::Listener
  void on_worker_failed(const Worker& w, const std::string& reason, int code, FailureKind kind) override;
  void on_group_ended() override;
  void on_stacks_dumped(const std::map<int, std::vector<StackFrame>>& by_rank,
                        const std::vector<std::string>& files) override;
  void on_hang_report(const HangReport& report) override;
  void on_hang_cleared(int rank, double after_s) override;
  void on_straggler(const Worker& w, double busy, double others) override;
  void on_pace(const std::map<int, double>& busy) override;
  void on_saving() override;
  std::optional<bool> others_saving() override;
  void on_job_pace(int round, JobPace job);
  // The job's ranks named stragglers across nodes now (group rank 0 judges them; 0 elsewhere).
  int job_stragglers() const;
  void on_job_hang_verdict(int seq, std::optional<JobHangVerdict> v, const std::string& error);
  int hangs_reported() const { return hangs_reported_; }
  // Rendezvous::Listener
  void on_round_ready(const RoundInfo& info) override;
  void on_rendezvous_failed(const RendezvousFailure& failure) override;
  void on_round_over(const RoundOutcome& outcome) override;
  void on_finished() override;
  void on_waiting_for_place() override;

 private:
  // Several nodes in the round, and the workers' store they share (for the exchanges across nodes).
  bool across_nodes() const { return info_.group_world > 1 && !info_.store_host.empty() && info_.store_port != 0; }
  SavingExchange& saves();  // the round's
  StoreQueue& store_queue();
  void enter(Phase p);
  void join(int round, int restart_count);
  void start_workers();
  void end_round(const RoundEnd& why, int expect_next);
  void log_outcome(const RoundOutcome& o);
  void decide();
  void decide_failure(const FailureRecord& root);
  FailureRecord blame_stuck_rank(const FailureRecord& root);
  void leave(int round);
  void finish(int code, Rendezvous::Ack ack);
  bool fenced(const Worker& w, FailureKind kind);
  void note_log_losses();
  void report_failure(FailureRecord root, const std::vector<std::string>& notes, int exits_with);
  void say_signal(int sig, bool forwarded) const;
  void second_signal(int sig);

  const AgentOptions& opt_;
  WorkerGroup& group_;
  Rendezvous& rdzv_;
  EventLog& events_;
  RunDir& dir_;
  std::string node_name_;
  FenceState* fence_;
  const StateAreas* state_;  // each local rank's state area, handed to its workers; may be null
  StateCopies* copies_ = nullptr;  // copies of the state across nodes; may be null
  int settling_ = -1;              // the round whose ranks' state is being put in place, before its workers
  std::function<void(std::function<void()>)> post_;

  Phase phase_ = Phase::rendezvous;
  int round_ = 0;
  int attempt_ = 0;  // TORCHELASTIC_RESTART_COUNT
  RoundInfo info_;
  std::optional<RoundOutcome> outcome_;      // how the current round ended, once known
  std::optional<FailureRecord> root_cause_;  // this node's first failure in the round
  std::vector<FailureRecord> failures_;      // this node's other failures
  std::optional<StuckRank> stuck_;           // from the stacks of a hang: the rank outside collectives
  std::optional<HangVerdict> verdict_;       // this round's hang verdict: the job's (every node's), else this node's
  int hangs_reported_ = 0;
  std::unique_ptr<HangExchange> exchange_;   // several nodes: one verdict from every node's summary
  std::unique_ptr<PaceExchange> pace_exchange_;  // several nodes: every node's pace, judged at group rank 0
  std::unique_ptr<SavingExchange> saves_;        // several nodes: who is saving (the store's counter)
  PaceJudge job_pace_;                           // there: the job's ranks, this round
  int job_pace_round_ = -1;
  std::vector<RankView> verdict_ranks_;      // the ranks the verdict was decided over (every node's)
  int hang_reports_in_attempt_ = 0;          // numbers this node's reports (the exchange's keys)
  // The pace's and saves' requests to the workers' store; after them, so that it ends first (its
  // requests hold them).
  std::unique_ptr<StoreQueue> store_queue_;
  int hang_seq_ = 0;                         // +1 per report and per clearing: a stale exchange is dropped
  rounds::Streak streak_;                    // the round's crash-loop streak, then the one after its failure
  std::vector<StreamOutput::FileLoss> log_losses_;  // log files left incomplete, for the end
  bool group_ended_ = true;
  int stop_signal_ = 0;    // ddprun was told to stop by this signal
  bool stopping_ = false;  // a signal started a stop (not only forwarded to the workers)
  int exit_code_ = 0;
  std::chrono::steady_clock::time_point attempt_started_, joined_at_;
  double rendezvous_s_ = 0, start_s_ = 0;
  int restarts_ = 0;
  bool waiting_ = false;  // beyond MAX, waiting for a place (a standby node) since `waited_from_`
  std::chrono::steady_clock::time_point waited_from_;
  RecoveryClock clock_;
};

}  // namespace ddprun::agent
