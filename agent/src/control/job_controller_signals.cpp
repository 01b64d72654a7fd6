// The job controller's signals (README: Security, "Every terminating signal handled"): forwarded
// to the workers when listed in --signals_to_handle, otherwise a request to stop.
#include <csignal>

#include <spdlog/spdlog.h>

#include "ddprun/common/exit_status.hpp"
#include "control/job_controller.hpp"

namespace ddprun::agent {
namespace {

// The signals whose forwarding also ends the workers (torchrun's default set).
bool terminating(int sig) { return sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT; }

}  // namespace

void JobController::on_signal(int sig) {
  // A signal not listed in --signals_to_handle (SIGUSR1 without it, SIGALRM, SIGXCPU, ...) is
  // a request to stop, handled as SIGTERM is: nothing ends ddprun without its grace period. A
  // forwarded one that does not end a process (a pre-emption notice) leaves the end to the
  // workers, so a SIGTERM after it is a first stop, with its grace period, not a second.
  const bool forwarded = opt_.forward_signals.count(sig) > 0;
  const bool stops = !forwarded || terminating(sig);
  if (stopping_ && (sig == SIGINT || sig == SIGTERM)) return second_signal(sig);
  if (phase_ == Phase::draining || phase_ == Phase::done) return;
  say_signal(sig, forwarded);
  if (stop_signal_ == 0 || (stops && !stopping_)) stop_signal_ = sig;
  stopping_ = stopping_ || stops;
  if (phase_ == Phase::rendezvous) return leave(round_);  // no worker runs here
  if (!outcome_) end_round(RoundEnd::of_stop(sig, node_name_, ""), 0);
  if (!forwarded) {
    group_.stop(SIGTERM);
  } else if (terminating(sig)) {
    group_.stop(sig);
  } else {
    group_.forward(sig);  // e.g. SIGUSR1, a preemption notice: the workers decide when to end
  }
  if (phase_ == Phase::running) enter(Phase::stopping);
  decide();
}

void JobController::say_signal(int sig, bool forwarded) const {
  if (phase_ == Phase::rendezvous) {
    spdlog::warn("ddprun: received {} during the rendezvous; leaving it (no worker runs yet)", signal_name(sig));
  } else if (forwarded) {
    spdlog::warn("ddprun: received {}; forwarding it to the workers", signal_name(sig));
  } else {
    spdlog::warn("ddprun: received {}; stopping the job: the workers get SIGTERM, and SIGKILL after --stop_timeout "
                 "(list it in --signals_to_handle to forward it to them instead)",
                 signal_name(sig));
  }
}

void JobController::second_signal(int sig) {
  spdlog::warn("ddprun: {} again: killing the workers now", signal_name(sig));
  group_.kill_now();
  if (phase_ == Phase::draining) enter(Phase::done);
}

}  // namespace ddprun::agent
