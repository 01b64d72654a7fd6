#include "control/job_controller.hpp"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <utility>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"
#include "observe/event_log.hpp"
#include "containment/run_dir.hpp"
#include "workers/output.hpp"
#include "workers/state_areas.hpp"
#include "workers/state_copies.hpp"
#include "workers/worker_plan.hpp"

namespace ddprun::agent {
namespace {

using Kind = RoundEnd::Kind;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

const char* to_string(Phase p) {
  switch (p) {
    case Phase::rendezvous: return "rendezvous";
    case Phase::running: return "running";
    case Phase::stopping: return "stopping";
    case Phase::draining: return "draining";
    case Phase::done: return "done";
  }
  return "?";
}

JobController::JobController(const AgentOptions& opt, WorkerGroup& group, Rendezvous& rdzv, EventLog& events,
                             RunDir& dir, std::string node_name, FenceState* fence, const StateAreas* state)
    : opt_(opt), group_(group), rdzv_(rdzv), events_(events), dir_(dir), node_name_(std::move(node_name)), fence_(fence),
      state_(state), clock_(events) {
  rdzv_.set_listener(*this);
  group_.set_listener(*this);
}

void JobController::enter(Phase p) {
  spdlog::debug("ddprun: {} -> {} (round {})", to_string(phase_), to_string(p), round_);
  phase_ = p;
  if (copies_ && (p == Phase::draining || p == Phase::done)) copies_->stop_sending();
}

void JobController::use_state_copies(StateCopies* copies, std::function<void(std::function<void()>)> post) {
  copies_ = copies;
  post_ = std::move(post);
}

void JobController::start() {
  if (!rdzv_.describe().empty()) spdlog::info("ddprun: joining the rendezvous through {}", rdzv_.describe());
  join(0, -1);  // new to the job: the restart count is the round's
}

void JobController::join(int round, int restart_count) {
  round_ = round;
  attempt_ = restart_count;
  outcome_.reset();
  root_cause_.reset();
  failures_.clear();
  stuck_.reset();
  verdict_.reset();
  verdict_ranks_.clear();
  hang_reports_in_attempt_ = 0;
  ++hang_seq_;
  joined_at_ = std::chrono::steady_clock::now();
  clock_.joining(joined_at_);
  enter(Phase::rendezvous);
  rounds::StateOffer offer;  // (in the node's record: where its copies are served, whether it holds state)
  if (copies_) {
    try {
      offer = copies_->offer();
    } catch (const Error& e) {
      spdlog::warn("ddprun: the workers' in-memory state is not copied across nodes: {}", e.what());
      copies_ = nullptr;
    }
  }
  rdzv_.join(round, restart_count, streak_, offer);
}

// ---- rendezvous events ------------------------------------------------------------------------

void JobController::on_round_ready(const RoundInfo& info) {
  if (phase_ != Phase::rendezvous) return;
  info_ = info;
  rendezvous_s_ = seconds_since(joined_at_);
  if (std::exchange(waiting_, false)) {
    // A standby node given a place: its start is timed as a recovery (from the place, its
    // workers handed to the spares made while it waited).
    const auto now = std::chrono::steady_clock::now();
    clock_.fault(0, fmt::format("a place in round {} (this node waited {:.1f} s for one)", info.round,
                                seconds_since(waited_from_)), now);
    clock_.stopped(now);
    clock_.joining(now);
  }
  clock_.round_ready();
  round_ = info.round;
  attempt_ = info.restart_count;
  streak_ = info.streak;
  if (opt_.rdzv.multi_node()) {
    spdlog::info("ddprun: rendezvous round {} complete: {} nodes, {} workers", round_, info.group_world,
                 info.world_size);
  }
  if (events_.enabled()) {
    nlohmann::json e = {{"round", round_}, {"world_size", info.world_size}, {"nodes", info.group_world},
                        {"group_rank", info.group_rank}};
    // Every member's host: known on group rank 0 only (a member reads its own place, not the others').
    if (!info.nodes.empty()) {
      nlohmann::json members = nlohmann::json::array();
      for (const auto& n : info.nodes) members.push_back(n.host);
      e["members"] = members;
    }
    events_.emit("rendezvous_complete", e);
  }
  // In a job of several nodes, each rank's saved state is put in place for it first: a node keeps
  // its place at a restart, but a rank may have moved with a change of members (a newcomer takes
  // a lost node's ranks), or been lost with one.
  if (copies_ && !info.store_host.empty() && info.store_port != 0) {
    try {
      const int round = round_;
      settling_ = round;
      copies_->prepare(info, [this, round] {
        post_([this, round] {
          if (phase_ == Phase::rendezvous && round_ == round && settling_ == round) start_workers();
        });
      });
      return;
    } catch (const Error& e) {
      spdlog::warn("ddprun: the workers' in-memory state is not copied across nodes: {}", e.what());
      copies_ = nullptr;
    }
  }
  // Without the copies (they could not start here) a round's saves are of its course still, as
  // every other node's are.
  if (state_ && info.group_world > 1) state_->begin_course(round_);
  start_workers();
}

void JobController::on_rendezvous_failed(const RendezvousFailure& f) {
  if (phase_ != Phase::rendezvous) return;
  using K = RendezvousFailure::Kind;
  if (f.kind == K::done) {
    spdlog::info("ddprun: {}", f.message);
  } else if (f.kind == K::stopped) {
    spdlog::warn("ddprun: {}", f.message);
  } else {
    spdlog::error("ddprun: {}", f.message);
  }
  exit_code_ = f.kind == K::done      ? 0
               : f.kind == K::stopped ? 128 + (f.signal > 0 ? f.signal : SIGTERM)
               : f.kind == K::usage   ? 2
                                      : 1;
  enter(Phase::done);
}

void JobController::on_round_over(const RoundOutcome& o) {
  if (phase_ == Phase::rendezvous && settling_ == o.round && o.round == round_ && !outcome_) {
    // Over while the ranks' state was being put in place, before any worker started: decided now.
    settling_ = -1;
    if (copies_) copies_->stop_sending();
    outcome_ = o;
    log_outcome(o);
    group_ended_ = true;
    enter(Phase::stopping);
    return decide();
  }
  if (o.round != round_ || outcome_ || (phase_ != Phase::running && phase_ != Phase::stopping)) return;
  outcome_ = o;
  log_outcome(o);
  if (o.end && !root_cause_ && o.end->kind != Kind::success && o.end->kind != Kind::stopped) {
    // Another node's fault, detected when the round's end reached this node: timed from the
    // fault's last sign of life (on the writer's wall clock), never less than the silence the
    // writer measured itself.
    const RoundEnd& e = *o.end;
    if (e.kind == Kind::failure) {
      const FailureRecord& f = *e.failure;
      const auto silent = std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::duration<double>(f.silent_s));
      clock_.fault(seconds_since_wall(f.time - silent, f.silent_s),
                   "rank " + std::to_string(f.rank) + " on " + e.host + ": " + f.reason);
    } else if (e.kind == Kind::node_lost) {
      clock_.fault(seconds_since_wall(e.since, e.idle_s), "node " + e.host + " lost");
    } else {
      clock_.fault(seconds_since_wall(e.since, 0), "node " + e.host + " joining");
    }
  }
  if (phase_ == Phase::running) {
    // A hang on another node: this node's stacks too (where is everyone stuck?).
    bool hang = o.end && o.end->kind == Kind::failure && o.end->failure->hang;
    if (!o.end || o.end->kind != Kind::success) group_.stop(SIGTERM, hang ? WorkerGroup::Stacks::first : WorkerGroup::Stacks::after_timeout);
    enter(Phase::stopping);
  }
  decide();
}

// Beyond the job's MAX: while this node waits for a place, its workers' spares import what the
// script needs, so that a place (a member lost) is taken warm. Their per-rank variables are
// placeholders: the hand-over sends the real ones.
void JobController::on_waiting_for_place() {
  if (phase_ != Phase::rendezvous || waiting_) return;
  waiting_ = true;
  waited_from_ = std::chrono::steady_clock::now();
  if (!opt_.spares.on) return;
  RoundInfo place;
  place.round = round_;
  place.group_world = opt_.rdzv.max_nodes;
  place.world_size = opt_.rdzv.max_nodes * opt_.nproc_per_node;
  try {
    group_.make_spares(plan_workers(opt_, place, dir_, state_));
  } catch (const Error& e) {
    spdlog::warn("ddprun: no warm spares while this node waits for a place: {}", e.what());
  }
}

void JobController::on_finished() {
  if (phase_ == Phase::draining) enter(Phase::done);
}

void JobController::log_outcome(const RoundOutcome& o) {
  if (!o.end) {
    spdlog::error("ddprun: {}; stopping this node", o.lost.message);
    return;
  }
  const RoundEnd& e = *o.end;
  switch (e.kind) {
    case Kind::failure:
      if (!root_cause_) {
        spdlog::warn("ddprun: round {} failed on host {} (rank {}: {}); stopping this node's workers", round_,
                     escape_for_log(e.failure->host), e.failure->rank, escape_for_log(e.failure->reason, 200));
      }
      break;
    case Kind::node_lost:
      spdlog::warn("ddprun: round {}: node {} ({}) stopped answering; stopping this node's workers", round_,
                   e.group_rank >= 0 ? std::to_string(e.group_rank) : std::string("?"), escape_for_log(e.host));
      events_.emit("node_lost", {{"round", round_}, {"group_rank", e.group_rank}, {"lost_host", e.host}});
      break;
    case Kind::membership:
      spdlog::info("ddprun: round {}: node {} wants to join; restarting with it", round_, escape_for_log(e.host));
      break;
    case Kind::stopped:
      spdlog::warn("ddprun: the job was stopped by {} on host {}", signal_name(e.signal), escape_for_log(e.host));
      break;
    case Kind::success:
      break;
  }
}

// ---- workers ----------------------------------------------------------------------------------

void JobController::start_workers() {
  settling_ = -1;
  const auto t0 = std::chrono::steady_clock::now();
  if (fence_) fence_->reset();
  try {
    group_.set_nodes(info_.group_world);
    // A single node at its last allowed restart starts no spares: no restart can follow (across
    // nodes a member's loss or arrival restarts the group whatever the count).
    group_.set_spares_wanted(opt_.rdzv.multi_node() || opt_.max_restarts < 0 || attempt_ < opt_.max_restarts);
    group_.start(plan_workers(opt_, info_, dir_, state_));
  } catch (const Error& e) {
    spdlog::error("ddprun: {}", e.what());
    finish(1, Rendezvous::Ack::no);
    return;
  }
  group_ended_ = false;
  attempt_started_ = std::chrono::steady_clock::now();
  start_s_ = seconds_since(t0);
  enter(Phase::running);
  clock_.started(attempt_, group_.warm_started(), static_cast<int>(group_.workers().size()) - group_.warm_started());
  if (clock_.timing()) group_.watch_first_beats([this] { clock_.ready(); });
  const auto& ws = group_.workers();
  if (events_.enabled()) {
    nlohmann::json ranks = nlohmann::json::array(), pids = nlohmann::json::array();
    for (const auto& w : ws) {
      ranks.push_back(w.spec.rank);
      pids.push_back(w.pid);
    }
    events_.emit("workers_started", {{"attempt", attempt_}, {"round", round_}, {"ranks", ranks}, {"pids", pids}});
  }
  if (opt_.rdzv.multi_node()) {
    spdlog::info("ddprun: round {}: node {} of {}, started ranks {}..{} of {} (restart count {}, store {}:{})",
                 round_, info_.group_rank, info_.group_world, info_.rank_offset,
                 info_.rank_offset + opt_.nproc_per_node - 1, info_.world_size, attempt_, info_.store_host,
                 info_.store_port);
  } else {
    spdlog::info("ddprun: started {} worker{} (attempt {}, store {}:{})", ws.size(), ws.size() == 1 ? "" : "s",
                 attempt_, info_.store_host, info_.store_port);
  }
}

void JobController::on_worker_failed(const Worker& w, const std::string& reason, int code, FailureKind kind) {
  auto when = w.running() ? std::chrono::system_clock::now() : w.ended_wall;
  FailureRecord f = make_failure_record(w.spec.rank, w.spec.local_rank, w.pid, w.status, when, w.spec.error_file, {});
  // (one in ddprun's temporary directory is gone when the summary is read: what it held is in it)
  if (const auto temp = dir_.disposable(); !temp.empty() && f.error_file.rfind(temp + "/", 0) == 0) f.error_file.clear();
  f.host = node_name_;
  f.reason = reason;
  f.exit_code = code;
  if (!w.stopped_by_agent() && events_.enabled()) {
    nlohmann::json e = {{"rank", w.spec.rank}, {"local_rank", w.spec.local_rank}, {"pid", w.pid},
                        {"reason", to_string(kind)}, {"detail", reason}, {"attempt", attempt_}};
    e["exit_code"] = kind == FailureKind::exit ? nlohmann::json(w.status.code) : nlohmann::json();
    e["signal"] = kind == FailureKind::signal || kind == FailureKind::oom ? nlohmann::json(w.status.signal)
                                                                           : nlohmann::json();
    events_.emit("worker_failed", e);
  }
  if (phase_ != Phase::running || w.stopped_by_agent() || stop_signal_ != 0 || fenced(w, kind)) {
    failures_.push_back(std::move(f));
    return;
  }
  // The first failure of the round on this node: the root cause, unless another node's came first.
  spdlog::debug("ddprun: root cause: rank {}: {}", w.spec.rank, f.reason);
  f.stderr_tail = group_.stderr_tail(w.spec.local_rank);
  f.hang = kind == FailureKind::hang;
  root_cause_ = f;
  f.silent_s = f.hang ? w.silent_s : 0;
  clock_.fault(f.silent_s, "rank " + std::to_string(w.spec.rank) + ": " + reason);
  end_round(RoundEnd::of_failure(f), info_.group_world);
  group_.stop(SIGTERM, f.hang ? WorkerGroup::Stacks::first : WorkerGroup::Stacks::after_timeout);
  enter(Phase::stopping);
}

// A worker SIGKILLed after this node's liveness lapsed was stopped by the guardian: the other
// nodes may count this node lost and go on without it. Its round ends "node lost" (this node),
// so that if they have not noticed, every node meets again, this one included.
bool JobController::fenced(const Worker& w, FailureKind kind) {
  if (!fence_ || kind != FailureKind::signal || w.status.signal != SIGKILL || !fence_->lapsed()) return false;
  spdlog::warn("ddprun: round {}: this node's liveness lapsed (ddprun was stopped or cut off from the rendezvous): "
               "its workers were stopped so that the other nodes can go on without it; it joins again", round_);
  const double silent = fence_->silent_s();  // since its last renewal: the others' last sign of it
  clock_.fault(silent, "this node was fenced");
  const auto since = std::chrono::system_clock::now() -
                     std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(silent));
  end_round(RoundEnd::of_node_lost(info_.group_rank, node_name_, silent, silent > 0 ? since : decltype(since){}),
            info_.group_world);
  group_.stop(SIGKILL);
  enter(Phase::stopping);
  return true;
}

// Log files a full disk cut short: said now and at the end, with the bytes they lack.
void JobController::note_log_losses() {
  for (auto& l : group_.take_log_losses()) {
    events_.emit("log_write_failed", {{"file", l.file}, {"error", std::strerror(l.error)}, {"bytes_lost", l.bytes_lost}});
    log_losses_.push_back(std::move(l));
  }
}

void JobController::on_group_ended() {
  group_ended_ = true;
  // The copies go on while the workers live: their last saves (a preempted job's checkpoint)
  // still reach the buddy, and a save waiting for one is not left to its time-out.
  if (copies_) copies_->stop_sending();
  clock_.abandoned();  // an attempt that ended before its workers' first beats
  clock_.stopped();
  note_log_losses();
  if (phase_ == Phase::running) {
    // Nothing failed: every worker exited 0.
    auto n = group_.workers().size();
    if (opt_.rdzv.multi_node()) {
      spdlog::info("ddprun: round {}: this node's {} worker{} exited 0 ({:.2f} s); waiting for the other nodes", round_, n,
                   n == 1 ? "" : "s", seconds_since(attempt_started_));
    } else {
      spdlog::info("ddprun: all {} worker{} exited 0 ({:.2f} s)", n, n == 1 ? "" : "s", seconds_since(attempt_started_));
    }
    rdzv_.report_success(round_);
    enter(Phase::stopping);
  }
  decide();
}

void JobController::end_round(const RoundEnd& why, int expect_next) { rdzv_.end_round(round_, why, expect_next); }

// ---- decisions --------------------------------------------------------------------------------

void JobController::decide() {
  if (phase_ != Phase::stopping || !group_ended_ || !outcome_) return;
  if (!outcome_->end) return finish(1, Rendezvous::Ack::no);
  const RoundEnd& e = *outcome_->end;
  switch (e.kind) {
    case Kind::success:
      if (info_.group_world > 1) spdlog::info("ddprun: all {} nodes finished; job done", info_.group_world);
      return finish(0, Rendezvous::Ack::yes);
    case Kind::stopped:
      spdlog::warn("ddprun: stopped by {}; the workers had run {:.2f} s", signal_name(e.signal),
                   seconds_since(attempt_started_));
      return finish(128 + (e.signal > 0 ? e.signal : SIGTERM), Rendezvous::Ack::yes);
    case Kind::failure:
      if (stop_signal_ == 0) return decide_failure(*e.failure);
      break;
    case Kind::node_lost:
    case Kind::membership:
      break;
  }
  if (stop_signal_ != 0) return leave(round_ + 1);  // signalled while this round was ending: no next round
  join(round_ + 1, attempt_);
}

// A stop signal with no round running here: the nodes in (or on their way to) `round` are told.
void JobController::leave(int round) {
  rdzv_.leave(round, stop_signal_);
  exit_code_ = 128 + stop_signal_;
  enter(Phase::draining);
}

void JobController::finish(int code, Rendezvous::Ack ack) {
  for (const auto& l : log_losses_) {
    spdlog::warn("ddprun: the log file '{}' is incomplete: {} bytes of output are missing from it ({}); the console "
                 "showed them", l.file, l.bytes_lost, std::strerror(l.error));
  }
  exit_code_ = code;
  clock_.cancel();
  group_.discard_spares();
  enter(Phase::draining);
  rdzv_.finish(round_, ack);
}

}  // namespace ddprun::agent
