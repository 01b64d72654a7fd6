// The job controller's failure decisions: which rank is the root cause of a hang (from the
// stacks), whether a failure restarts the job, ends it, or is a crash loop, and the summary.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "containment/run_dir.hpp"
#include "control/job_controller.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"
#include "observe/event_log.hpp"
#include "workers/output.hpp"

namespace ddprun::agent {

void JobController::on_stacks_dumped(const std::map<int, std::vector<StackFrame>>& by_rank,
                                     const std::vector<std::string>& dumped) {
  if (by_rank.empty()) return;
  const auto files = dir_.keep_stacks(dumped);
  std::string where = files.empty() ? "" : " (full dumps: " + files.front().substr(0, files.front().rfind('/')) +
                                               (files.size() > 1 ? " and the other ranks' stack.txt)" : ")");
  write_to_console("ddprun: stacks of the workers on " + node_name_ + ", innermost first" + where + ":\n" +
                   summarize_stacks(by_rank));
  stuck_ = rank_outside_collectives(by_rank);
  if (events_.enabled()) {
    nlohmann::json stacks = nlohmann::json::object();
    for (const auto& [rank, frames] : by_rank) stacks[std::to_string(rank)] = describe_frames(frames);
    events_.emit("stacks_dumped", {{"attempt", attempt_}, {"round", round_}, {"stacks", stacks}, {"files", files}});
  }
}

void JobController::on_hang_report(const HangReport& report) {
  auto ranks = report.ranks;
  for (auto& r : ranks) r.host = node_name_;
  verdict_ = decide_hang(ranks);
  verdict_ranks_ = ranks;
  ++hangs_reported_;
  ++hang_reports_in_attempt_;
  const int seq = ++hang_seq_;
  const bool several = across_nodes();
  const auto files = dir_.keep_stacks(report.files);
  write_to_console(format_hang_report(*verdict_, ranks, node_name_, report.reason, files, report.stop_in,
                                      report.rank, several));
  if (several) {
    if (!exchange_) exchange_ = std::make_unique<HangExchange>(group_.loop());
    HangExchangeSetup s;
    s.store_host = info_.store_host;
    s.store_port = info_.store_port;
    s.attempt = attempt_;
    s.report = hang_reports_in_attempt_;
    s.node = info_.group_rank;
    s.nodes = info_.group_world;
    s.wait = std::clamp<std::chrono::milliseconds>(report.stop_in / 2, std::chrono::seconds(2), std::chrono::seconds(15));
    exchange_->start(s, ranks, [this, seq](std::optional<JobHangVerdict> v, std::string error) {
      on_job_hang_verdict(seq, std::move(v), error);
    });
  }
  if (!events_.enabled()) return;
  nlohmann::json stacks = nlohmann::json::object(), states = nlohmann::json::object();
  for (const auto& r : ranks) {
    stacks[std::to_string(r.rank)] = describe_frames(r.python.empty() ? r.native : r.python);
    states[std::to_string(r.rank)] = std::string(1, r.state);
  }
  events_.emit("hang_reported", {{"attempt", attempt_}, {"round", round_}, {"rank", report.rank},
                                 {"reason", report.reason}, {"silent_s", report.silent_s},
                                 {"kind", to_string(verdict_->kind)}, {"blamed", verdict_->blamed},
                                 {"verdict", verdict_->text}, {"stacks", stacks}, {"states", states},
                                 {"files", files}, {"node_only", several},
                                 {"stop_in_s", std::chrono::duration<double>(report.stop_in).count()}});
}

void JobController::on_job_hang_verdict(int seq, std::optional<JobHangVerdict> v, const std::string& error) {
  if (seq != hang_seq_) return;  // an earlier report's (cleared since, or of an earlier attempt)
  if (!v) {
    spdlog::warn("ddprun: no verdict from every node's summary ({}): this node's stands", error);
    return;
  }
  verdict_ = v->verdict;
  verdict_ranks_ = v->ranks;
  std::string missing;
  for (int n : v->missing_nodes) missing += (missing.empty() ? "" : ", ") + std::to_string(n);
  write_to_console("ddprun: hang verdict from every node's ranks" +
                   (missing.empty() ? std::string() : " (no summary from node " + missing + ")") + ": " +
                   v->verdict.text + "\n");
  events_.emit("hang_verdict", {{"attempt", attempt_}, {"kind", to_string(v->verdict.kind)},
                                {"blamed", v->verdict.blamed}, {"verdict", v->verdict.text},
                                {"missing_nodes", v->missing_nodes}, {"gathered_here", v->gathered_here}});
}

void JobController::on_straggler(const Worker& w, double busy, double others) {
  events_.emit("straggler", {{"attempt", attempt_}, {"rank", w.spec.rank}, {"local_rank", w.spec.local_rank},
                             {"pid", w.pid}, {"busy", busy}, {"others_busy", others}});
}

// Across nodes (control/pace_exchange.hpp): each window of this node's ranks goes to the workers'
// store, and group rank 0 judges the job's ranks over every node's: a straggler that no node can
// see among its own ranks (one rank a node, a slow host) is named there.
void JobController::on_pace(const std::map<int, double>& busy) {
  if (!across_nodes()) return;
  try {
    if (!pace_exchange_) pace_exchange_ = std::make_unique<PaceExchange>(group_.loop(), store_queue());
  } catch (const Error& e) {  // no thread to be had: this window is skipped, nothing more
    spdlog::debug("ddprun: the pace exchange: {}", e.what());
    return;
  }
  PaceSetup s{info_.store_host, info_.store_port, round_, info_.group_rank, info_.group_world, node_name_};
  pace_exchange_->window(s, busy, [this, round = round_](JobPace job) { on_job_pace(round, std::move(job)); });
}

// Saves across nodes (control/saving_exchange.hpp): a rank of this node in torch.save beats a
// count in the workers' store, and this node's silent ranks are not reported while another's does.
void JobController::on_saving() {
  if (!across_nodes()) return;
  try {
    saves().saving();
  } catch (const Error& e) {  // no thread to be had: no beat (the other nodes may report a hang)
    spdlog::debug("ddprun: the saves' count: {}", e.what());
  }
}

std::optional<bool> JobController::others_saving() {
  if (!across_nodes()) return false;
  try {
    return saves().others();
  } catch (const Error& e) {  // as a read that failed: nobody is taken to be saving
    spdlog::debug("ddprun: the saves' count: {}", e.what());
    return false;
  }
}

StoreQueue& JobController::store_queue() {
  if (!store_queue_) store_queue_ = std::make_unique<StoreQueue>();
  return *store_queue_;
}

SavingExchange& JobController::saves() {
  if (!saves_) saves_ = std::make_unique<SavingExchange>(group_.loop(), store_queue());
  saves_->use(info_.store_host, info_.store_port, round_);
  return *saves_;
}

void JobController::on_job_pace(int round, JobPace job) {
  if (round != round_ || job.empty()) return;  // of a round that ended since
  if (job_pace_round_ != round) {
    job_pace_ = PaceJudge();
    job_pace_round_ = round;
  }
  std::map<int, double> busy;
  for (const auto& [rank, at] : job) busy[rank] = at.second;
  for (const auto& n : job_pace_.window(busy)) {
    const std::string& host = job.at(n.rank).first;
    spdlog::warn("ddprun: rank {} (host {}) is a straggler across the job's {} nodes: its main thread was busy {:.0f}% of "
                 "the time over the last {} windows, the job's other ranks {:.0f}% (median): they wait for it in every "
                 "collective",
                 n.rank, escape_for_log(host), info_.group_world, n.busy * 100, PaceJudge::kSlowWindows, n.others * 100);
    events_.emit("straggler", {{"attempt", attempt_}, {"rank", n.rank}, {"host", host}, {"busy", n.busy},
                               {"others_busy", n.others}, {"across_nodes", true}});
  }
}

int JobController::job_stragglers() const {
  if (job_pace_round_ != round_ || info_.group_rank != 0) return 0;
  int n = 0;
  for (int r = 0; r < info_.world_size; ++r) n += job_pace_.straggler(r);
  return n;
}

void JobController::on_hang_cleared(int rank, double after_s) {
  verdict_.reset();
  verdict_ranks_.clear();
  ++hang_seq_;
  events_.emit("hang_cleared", {{"attempt", attempt_}, {"rank", rank}, {"after_s", after_s}});
}

// A hang whose first lapsed heartbeat was a rank waiting in a collective, while another rank of
// this node was outside any (its stack says so): that one is the root cause, and the waiting
// rank a consequence. The blamed rank's own record (it was stopped) becomes the root.
FailureRecord JobController::blame_stuck_rank(const FailureRecord& root) {
  if (!root.hang) return root;
  const bool root_here = root_cause_ && root_cause_->pid == root.pid && root.host == node_name_;
  std::string why;
  int blamed_rank = -1;
  if (verdict_ && !verdict_->blamed.empty()) {  // the job's verdict, or this node's
    why = verdict_->text;
    blamed_rank = verdict_->blamed.front();
  } else if (stuck_ && root_here) {
    std::string waiting;
    for (int r : stuck_->waiting) waiting += (waiting.empty() ? "" : ",") + std::to_string(r);
    why = "hung outside any collective (" + stuck_->where + ") while rank" + (stuck_->waiting.size() == 1 ? " " : "s ") +
          waiting + " waited in one for it";
    blamed_rank = stuck_->rank;
  } else {
    return root;
  }
  if (blamed_rank == root.rank) {  // its own heartbeat lapsed first: say why
    FailureRecord same = root;
    same.reason = why + "; " + root.reason;
    if (root_here) root_cause_->reason = same.reason;
    return same;
  }
  auto it = std::find_if(failures_.begin(), failures_.end(), [&](const FailureRecord& f) { return f.rank == blamed_rank; });
  if (it != failures_.end() && root_here) {  // this node's: its own record becomes the root
    FailureRecord blamed = *it;
    failures_.erase(it);
    blamed.reason = why + "; rank " + std::to_string(root.rank) + ": " + root.reason;
    blamed.hang = true;
    blamed.exit_code = root.exit_code;
    root_cause_ = blamed;
    failures_.push_back(root);
    return blamed;
  }
  // On another node (or this one, the round's root on another): the rank as the verdict read it.
  FailureRecord blamed = root;
  blamed.rank = blamed_rank;
  auto view = std::find_if(verdict_ranks_.begin(), verdict_ranks_.end(), [&](const RankView& v) { return v.rank == blamed_rank; });
  if (view != verdict_ranks_.end()) {
    blamed.host = view->host;
    blamed.pid = view->pid;
    blamed.local_rank = view->local_rank;
  }
  blamed.reason = why + "; rank " + std::to_string(root.rank) + " (host " + root.host + "): " + root.reason;
  blamed.stderr_tail.clear();
  blamed.message.clear();
  blamed.traceback.clear();
  blamed.error_file.clear();
  return blamed;
}

void JobController::decide_failure(const FailureRecord& given) {
  const FailureRecord root = blame_stuck_rank(given);
  // The streak from the round's (the same on every member) and, with several nodes, the round's
  // end as every member read it (not this node's blame of a stuck rank): every member of the
  // round reaches the same crash-loop verdict.
  const auto after = rounds::after_failure(info_.streak, opt_.rdzv.multi_node() ? given : root, attempt_, opt_.max_restarts,
                                   opt_.max_same_failures);
  streak_ = after.streak;
  std::vector<std::string> notes;
  if (streak_.host_same > 1) {
    notes.push_back("Host " + streak_.host + " caused the last " + std::to_string(streak_.host_same) + " failures.");
  }
  if (after.verdict == rounds::AfterFailure::Verdict::crash_loop) {
    notes.push_back("Crash loop: rank " + std::to_string(root.rank) + " failed the same way (" + root.reason + ") on " +
                    std::to_string(streak_.same) + " consecutive attempts (--max_same_failures=" +
                    std::to_string(opt_.max_same_failures) + "): restarting will not mend it, and the exit code " +
                    std::to_string(kCrashLoopExitCode) + " says not to requeue the job.");
    events_.emit("crash_loop", {{"rank", root.rank}, {"host", root.host}, {"reason", root.reason},
                                {"attempts", streak_.same}, {"exit_code", kCrashLoopExitCode}});
    report_failure(root, notes, kCrashLoopExitCode);
    return finish(kCrashLoopExitCode, Rendezvous::Ack::yes);
  }
  if (after.verdict == rounds::AfterFailure::Verdict::no_restart_left) {
    report_failure(root, notes, root.exit_code);
    return finish(root.exit_code, Rendezvous::Ack::yes);
  }
  int next = attempt_ + 1;
  ++restarts_;
  std::string who = "rank " + std::to_string(root.rank);
  if (opt_.rdzv.multi_node()) {
    spdlog::warn("ddprun: restarting the job on every node (restart {} of {})", next, opt_.max_restarts);
    who += " on " + root.host;
  } else {
    spdlog::warn("ddprun: rank {} failed ({}); restarting the worker group (restart {} of {})", root.rank, root.reason,
                 next, opt_.max_restarts);
  }
  if (streak_.host_same > 1) spdlog::warn("ddprun: host {} caused the last {} failures", escape_for_log(streak_.host), streak_.host_same);
  events_.emit("restart", {{"count", next}, {"reason", who + ": " + root.reason}, {"host", root.host},
                           {"host_streak", streak_.host_same}});
  join(round_ + 1, next);
}

// The summary: the root cause (with its last stderr lines, complete now that the output is
// drained) and this node's other failures.
void JobController::report_failure(FailureRecord root, const std::vector<std::string>& notes, int exits_with) {
  std::vector<FailureRecord> others;
  for (auto f : failures_) {
    f.stderr_tail = group_.stderr_tail(f.local_rank);
    others.push_back(std::move(f));
  }
  if (root_cause_ && root_cause_->pid == root.pid && root_cause_->host == root.host) {
    root.stderr_tail = group_.stderr_tail(root_cause_->local_rank);
  } else if (root_cause_) {
    others.push_back(*root_cause_);  // this node failed too, but after the root cause
  }
  write_to_console(format_failure_report(root, others, opt_.role, attempt_, opt_.max_restarts, notes, exits_with));
}

}  // namespace ddprun::agent
