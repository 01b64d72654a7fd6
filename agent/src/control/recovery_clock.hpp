#pragma once
// Every recovery timed by phase (README: "Recovery in a blink"): from a fault to the next
// attempt's every worker having reported its first step. The controller marks each phase as it
// ends; when every worker of the new attempt has beaten once (its first heartbeat: with the
// progress hook, the end of its first optimizer step), the recovery is complete and is shown:
// one line on the console, a "recovery" event in the JSONL log, and a sample for the
// ddprun_recovery_seconds histogram (metrics.hpp).
//
// Phases, each from the end of the one before:
//   detect      the fault's last sign of life to this agent knowing of it: a crash: 0 (its exit
//               is reaped at once); a hang: the worker's silence since its last heartbeat (or its
//               start); a lost node: its last keep-alive as its watcher saw it, to the round's end
//               read here; this node fenced: its last renewal, to its workers' SIGKILL seen; a
//               node asking to join: its request, to the round's end read here; another node's
//               failure: the fault there (a hang: its silence) to its report read here
//   stop        the other workers of this node stopped and their output drained
//   rendezvous  this node joining the next round to the round ready
//   spawn       every worker of the new attempt started (cold) or handed to a warm spare
//   ready       every worker's first heartbeat

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::agent {

class EventLog;

struct RecoveryTimes {
  int attempt = 0;           // the new attempt's TORCHELASTIC_RESTART_COUNT
  std::string cause;         // "rank 1: exited with code 3"
  double detect = 0, stop = 0, rendezvous = 0, spawn = 0, ready = -1;  // seconds; ready < 0: none
  int warm = 0, cold = 0;    // workers handed to a spare, started cold
  double total() const { return detect + stop + rendezvous + spawn + (ready > 0 ? ready : 0); }
};

// Phase names in order, as the histogram labels them; "total" is the sum.
const std::vector<const char*>& recovery_phase_names();
double phase_seconds(const RecoveryTimes& t, const std::string& phase);

// Seconds from `since` (a wall-clock time, perhaps another node's; the epoch: unknown) to `now`,
// and never less than `at_least` (what a node measured on its own clock: a lower bound when the
// two nodes' wall clocks disagree). A gap over an hour is taken for a wrong clock.
double seconds_since_wall(std::chrono::system_clock::time_point since, double at_least,
                          std::chrono::system_clock::time_point now = std::chrono::system_clock::now());

// The console line: "restarted in 0.21 s: detect 1 ms, stop 12 ms, rendezvous 3 ms, hand-over
// 1 ms (2 warm), ready 190 ms".
std::string describe_recovery(const RecoveryTimes& t);

class RecoveryClock {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RecoveryClock(EventLog& events) : events_(events) {}

  // A fault that ends the round (the first one only), `detect_s` before `now`.
  void fault(double detect_s, const std::string& cause, Clock::time_point now = Clock::now());
  void stopped(Clock::time_point now = Clock::now());         // this node's group ended
  void joining(Clock::time_point now = Clock::now());         // the next round joined
  void round_ready(Clock::time_point now = Clock::now());
  void started(int attempt, int warm, int cold, Clock::time_point now = Clock::now());
  // Every worker beat once: the recovery is complete and shown; false when none was timed.
  bool ready(Clock::time_point now = Clock::now());
  // The attempt ended before its workers beat: shown without "ready".
  void abandoned();
  // The job ends (success, no restart left): a fault not followed by a restart is forgotten.
  void cancel() { state_ = State::idle; }

  bool timing() const { return state_ == State::running; }  // a new attempt awaits its first beats
  const std::vector<RecoveryTimes>& completed() const { return done_; }

 private:
  void show(const RecoveryTimes& t);
  enum class State { idle, faulted, stopped, joined, ready_round, running };
  EventLog& events_;
  State state_ = State::idle;
  RecoveryTimes now_;
  Clock::time_point mark_;
  std::vector<RecoveryTimes> done_;
};

}  // namespace ddprun::agent
