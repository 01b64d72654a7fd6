// The simulator's scheduler: which parked call is delivered next, when virtual time moves on,
// which fault happens; the invariants over what nodes report; liveness in quiet time.
#include <algorithm>
#include <sstream>

#include "ddprun/rounds/records.hpp"
#include "sim_world.hpp"

namespace ddprun::rounds::sim {
namespace {

using namespace std::chrono_literals;

std::string join_text(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

}  // namespace

bool World::ready(const Task& t) const {
  const Node& n = *t.node;
  if (n.paused) return false;
  if (t.ring && now_ < n.ring_slow_until) return false;
  switch (t.park) {
    case Task::Park::none: return false;
    case Task::Park::call: return now_ >= t.not_before;
    case Task::Park::sleep: return now_ >= t.deadline;
    case Task::Park::wait:
      if (now_ >= t.deadline || (t.interruptible && !n.events.empty())) return true;
      for (const auto& k : t.texts) {
        if (!kv_.has(k)) return false;
      }
      return true;
  }
  return false;
}

void World::resume(Task& t) {
  current_ = &t;
  t.park = Task::Park::none;
  t.fiber->resume();
  current_ = nullptr;
}

std::optional<Time> World::next_time() const {
  std::optional<Time> best;
  auto consider = [&](Time t) {
    if (t > now_ && (!best || t < *best)) best = t;
  };
  for (const auto& t : tasks_) {
    if (t->park == Task::Park::call) consider(t->not_before);
    if (t->park == Task::Park::wait || t->park == Task::Park::sleep) consider(t->deadline);
  }
  for (const auto& n : nodes_) {
    if (!n->alive) continue;
    if (n->paused) consider(n->paused_until);
    consider(n->ring_slow_until);
    if (n->workers) consider(n->fence_until);
  }
  for (const auto& r : restarts_) consider(r.at);
  return best;
}

// The fence (the guardian, which runs on when the agent does not): workers past it are killed.
void World::fence() {
  for (auto& n : nodes_) {
    if (n->workers && now_ >= n->fence_until) {
      note("fence: " + n->id + "'s workers killed");
      n->workers = false;
      n->events.push_back({Event::Kind::workers_failed, n->round, 0, -9});
    }
    if (n->paused && now_ >= n->paused_until) n->paused = false;
  }
}

void World::expire_leases() {
  if (s_.flavor != Flavor::etcd || now_ == expired_at_) return;
  expired_at_ = now_;
  const auto ttl = std::chrono::milliseconds(s_.opt.lease_ttl);
  for (auto& n : nodes_) {
    if (n->alive && !n->paused && now_ >= n->ring_slow_until) n->lease_until = now_ + ttl;
  }
  kv_.erase_if([&](const std::string&, const Keys::Entry& e) {
    const Written& w = e.meta;
    return (w.life == Lifetime::node && w.owner->lease_until <= now_) || (w.life == Lifetime::marker && w.expires <= now_);
  });
}

void World::restarts() {
  for (std::size_t i = 0; i < restarts_.size();) {
    if (restarts_[i].at <= now_) {
      Restart r = restarts_[i];
      restarts_.erase(restarts_.begin() + static_cast<long>(i));
      if (r.launch == launch_) current_nodes_[r.slot] = &start_node(r.slot, r.launch, r.id);
    } else {
      ++i;
    }
  }
}

void World::crash(Node& n) {
  note("crash " + n.id);
  n.alive = false;
  n.state = Node::State::crashed;
  n.workers = false;
  for (auto& t : tasks_) {
    if (t->node == &n && !t->fiber->done()) {
      t->crash = true;
      resume(*t);
    }
  }
}

void World::relaunch() {
  note("relaunch of the whole job, same run id");
  for (auto* n : current_nodes_) {
    if (n->alive) crash(*n);
  }
  restarts_.clear();
  ++launch_;
  ++relaunches_;
  for (int i = 0; i < s_.nodes; ++i) current_nodes_[i] = &start_node(i, launch_, fresh_id());
}

void World::outcome() {
  std::vector<Node*> running;
  for (auto* n : current_nodes_) {
    if (n->alive && n->workers && !n->paused) running.push_back(n);
  }
  if (running.empty()) return;
  Node& n = *running[pick(static_cast<int>(running.size()))];
  n.workers = false;
  if (chance(0.5)) {
    note(n.id + ": workers failed");
    n.events.push_back({Event::Kind::workers_failed, n.round, 0, cause()});
  } else {
    note(n.id + ": workers succeeded");
    n.succeeded = true;
    rounds_[{n.epoch, n.round}].succeeded.insert(n.id);
    n.events.push_back({Event::Kind::workers_succeeded, n.round, 0});
  }
}

void World::replay() {
  if (puts_.empty()) return;
  auto [k, v] = puts_[pick(static_cast<int>(puts_.size()))];
  // etcd refuses a write on a lease that expired.
  if (s_.flavor == Flavor::etcd && v.meta.life == Lifetime::node && v.meta.owner->lease_until <= now_) return;
  note("stale write replayed: " + k + " = " + v.value);
  check_put(k, v.value);
  kv_.put(k, v);
}

void World::fault() {
  Node& n = *current_nodes_[pick(static_cast<int>(current_nodes_.size()))];
  const ms ttl = s_.opt.keep_alive_interval * s_.opt.keep_alive_max_attempt;
  switch (pick(14)) {
    case 12:
    case 13:
      for (auto& t : tasks_) {
        if (t->node == &n && t->park == Task::Park::call && chance(0.5)) {
          t->not_before = now_ + ms(pick(static_cast<int>(2 * ttl.count())));
          note("delay a call of " + n.id + (t->ring ? "/watch" : "") + " by " + std::to_string((t->not_before - now_) / 1ms) + "ms");
          return;
        }
      }
      return;
    case 0:
    case 1:
      if (!n.alive) return;
      crash(n);
      // A new node id: ddprun draws one at each start (describe_self), so an agent never comes back as itself.
      restarts_.push_back({n.slot, n.launch, fresh_id(), now_ + ms(200 + pick(3000))});
      return;
    case 2:
      if (!n.alive) return;
      n.paused = true;
      n.paused_until = now_ + ms(pick(static_cast<int>(3 * ttl.count())));
      note("pause " + n.id + " until t+" + std::to_string((n.paused_until - now_) / 1ms) + "ms");
      return;
    case 3:
      n.ring_slow_until = now_ + ms(pick(static_cast<int>(3 * ttl.count())));
      note("keep-alive of " + n.id + " held back " + std::to_string((n.ring_slow_until - now_) / 1ms) + "ms");
      return;
    case 4:
      for (auto& t : tasks_) {
        if (t->node == &n && t->park == Task::Park::call && !n.paused) {
          note("fail a call of " + n.id);
          t->fail = true;
          return resume(*t);
        }
      }
      return;
    case 5:
    case 6: return replay();
    case 7:
      if (relaunches_ < 2 && chance(0.3)) relaunch();
      return;
    default: return outcome();
  }
}

// One step: a fault, or a ready call delivered, or time moved to the next deadline.
bool World::step(bool faults) {
  ++steps_;
  faulting_ = faults;
  fence();
  expire_leases();
  restarts();
  if (faults && chance(0.06)) {
    fault();
  } else {
    std::vector<Task*> r;
    for (auto& t : tasks_) {
      if (!t->fiber->done() && ready(*t)) r.push_back(t.get());
    }
    if (!r.empty()) {
      resume(*r[pick(static_cast<int>(r.size()))]);
      now_ += ms(pick(3));
    } else if (auto t = next_time()) {
      now_ = *t;
    } else {
      return false;
    }
  }
  tasks_.erase(std::remove_if(tasks_.begin(), tasks_.end(), [](auto& t) { return t->fiber->done(); }), tasks_.end());
  return true;
}

// A member keeps the group rank g it last ran with (round R') where g is below the round's size,
// unless the member now at g last ran with g in a later round than R'.
void World::check_kept_place(const Node& n, const RoundInfo& info, const std::vector<std::string>& hosts) {
  if (s_.kind == BackendKind::static_ranks) return;
  const auto claim_of = [&](const std::string& id) -> std::pair<int, int> {
    auto now = place_.find(id);
    if (now == place_.end()) return {-1, -1};
    if (now->second.first != info.round) return now->second;
    auto before = place_before_.find(id);  // it joined this round already: its claim came before
    return before == place_before_.end() ? std::pair<int, int>{-1, -1} : before->second;
  };
  const auto [was_round, was_rank] = claim_of(n.id);
  if (was_rank >= 0 && was_rank < static_cast<int>(hosts.size()) && info.group_rank != was_rank) {
    const auto [holder_round, holder_rank] = claim_of(hosts[was_rank]);
    if (holder_rank != was_rank || holder_round <= was_round) {
      violate("round " + std::to_string(info.round) + ": " + n.id + " ran round " + std::to_string(was_round) +
              " as group rank " + std::to_string(was_rank) + " and lost that place to " + hosts[was_rank] +
              ", which had no later claim to it");
    }
  }
  if (place_.count(n.id)) place_before_[n.id] = place_[n.id];
  place_[n.id] = {info.round, info.group_rank};
}

void World::joined(Node& n, const RoundInfo& info, const std::vector<std::string>& hosts) {
  const int round = info.round, group_rank = info.group_rank;
  note(n.id + " in round " + std::to_string(round) + " as " + std::to_string(group_rank) + " of [" + join_text(hosts) +
       "], restart count " + std::to_string(info.restart_count));
  n.epoch = epoch_;
  n.round = round;
  n.group_rank = group_rank;
  n.group_world = info.group_world;
  RoundSeen& r = rounds_[{epoch_, round}];
  if (r.hosts.empty()) r.hosts = hosts;
  if (r.hosts != hosts) {
    violate("round " + std::to_string(round) + " closed twice: [" + join_text(r.hosts) + "] and, for " + n.id + ", [" +
            join_text(hosts) + "]");
  }
  if (r.restart_count < 0) r.restart_count = info.restart_count;
  if (r.restart_count != info.restart_count) {
    violate("round " + std::to_string(round) + ": restart count " + std::to_string(r.restart_count) + " on one member, " +
            std::to_string(info.restart_count) + " on " + n.id + " (nodes would disagree on restarts left)");
  }
  std::set<std::string> distinct(hosts.begin(), hosts.end());
  if (distinct.size() != hosts.size() || group_rank >= static_cast<int>(hosts.size()) || hosts[group_rank] != n.id) {
    violate("round " + std::to_string(round) + ": a rank twice, or not its own, in [" + join_text(hosts) + "] for " + n.id);
  }
  if (s_.kind == BackendKind::static_ranks && group_rank != n.slot) {
    violate(n.id + " has --node_rank " + std::to_string(n.slot) + " but group rank " + std::to_string(group_rank));
  }
  check_kept_place(n, info, hosts);
  auto last = last_round_.find(n.id);
  const bool same_epoch = last != last_round_.end() && last->second.first == epoch_;
  if (same_epoch && last->second.second >= round) {
    violate(n.id + " went back from round " + std::to_string(last->second.second) + " to " + std::to_string(round));
  }
  // A member of a round that ran learns how it ended (a failure with no restart left ends the
  // job on every node): it never goes on past that round without having joined it, unless it
  // took part in ending it (it gave up on a member as lost, and another end stood: it learns the
  // job's count from the next round's restart count, or that the job finished from its marker).
  for (auto it = rounds_.lower_bound({epoch_, same_epoch ? last->second.second + 1 : 0});
       it != rounds_.end() && it->first.first == epoch_ && it->first.second < round; ++it) {
    const RoundSeen& was = it->second;
    if (was.decisive && std::find(was.hosts.begin(), was.hosts.end(), n.id) != was.hosts.end() && !was.tried_end.count(n.id)) {
      violate(n.id + " was a member of round " + std::to_string(it->first.second) + ", which ran, and went on to round " +
              std::to_string(round) + " without learning how it ended");
    }
  }
  last_round_[n.id] = {epoch_, round};
  // The members of the job's last round learn of its end one by one: later than that round is wrong.
  // A node whose first look at the run came close_timeout after the end is a relaunch (it meets
  // after the old rounds): however long ago its process started, nothing tells it apart from one.
  const bool relaunch = n.first_look && *n.first_look >= finished_at_[n.launch] + s_.opt.close_timeout;
  if (launch_finished_[n.launch] && round > finished_round_[n.launch] && !relaunch) {
    violate(n.id + " joined round " + std::to_string(round) + " after its job had finished with round " +
            std::to_string(finished_round_[n.launch]));
  }
}

void World::ended(Node& n, int round, const std::string& end_json) {
  RoundEnd e = parse_round_end("end", end_json);
  RoundSeen& r = rounds_[{n.epoch, round}];
  const bool all = std::all_of(r.hosts.begin(), r.hosts.end(), [&](const std::string& h) { return r.succeeded.count(h) > 0; });
  note(n.id + " saw round " + std::to_string(round) + " end: " + to_string(e.kind));
  if (e.kind == RoundEnd::Kind::success && !all) violate("round " + std::to_string(round) + " ended 'success' before every member's workers succeeded");
}

void World::finished(Node& n) {
  note(n.id + " finished: the job is over");
  // The job ended when its marker was written (a node paused after writing it says so later).
  const auto marked = marked_at_.find(n.launch);
  if (!launch_finished_[n.launch]) finished_round_[n.launch] = n.round, finished_at_[n.launch] = marked != marked_at_.end() ? marked->second : now_;
  launch_finished_[n.launch] = true;
}

std::string World::run() {
  for (int i = 0; i < s_.fault_steps && violation_.empty(); ++i) {
    if (!step(true)) break;
    // A node that failed is started again (a restart policy), unless its job is over.
    for (Node* n : current_nodes_) {
      if (n->state == Node::State::failed && !launch_finished_[n->launch] && chance(0.05)) {
        n->state = Node::State::crashed;
        restarts_.push_back({n->slot, n->launch, fresh_id(), now_ + ms(100 + pick(2000))});
      }
    }
    if (launch_finished_[launch_] && relaunches_ < 2 && chance(0.01)) relaunch();
  }
  if (!violation_.empty() || !s_.liveness) return violation_;
  // Quiet time: every node of the job is started again, nothing fails any more.
  note("quiet");
  for (Node* n : current_nodes_) {
    n->paused = false;
    n->ring_slow_until = now_;
    bool waiting = std::any_of(restarts_.begin(), restarts_.end(), [&](const Restart& r) { return r.slot == n->slot; });
    if (!n->alive && n->state != Node::State::done && !waiting && !launch_finished_[launch_]) {
      restarts_.push_back({n->slot, n->launch, fresh_id(), now_ + ms(100)});
    }
  }
  const Time until = now_ + kQuietBound;
  while (violation_.empty() && now_ < until && !settled()) {
    if (!step(false)) break;
    // The restart policy goes on: a node that fails now (alone in a round past join_timeout) is
    // started again, unless it was told its job finished.
    for (Node* n : current_nodes_) {
      const bool told = n->why.rfind("finished", 0) == 0;
      const bool waiting = std::any_of(restarts_.begin(), restarts_.end(), [&](const Restart& r) { return r.slot == n->slot; });
      if (n->state == Node::State::failed && !told && !waiting && !launch_finished_[n->launch]) {
        n->state = Node::State::crashed;
        restarts_.push_back({n->slot, n->launch, fresh_id(), now_ + ms(100)});
      }
    }
  }
  if (!violation_.empty()) return violation_;
  if (!settled()) return check_quiet_liveness();
  return "";
}

Outcome run_seed(std::uint64_t seed, bool trace, bool liveness) {
  Outcome o;
  Settings s = settings_of(seed);
  s.liveness = liveness;
  World w(s, trace);
  o.violation = w.run();
  if (!o.violation.empty()) o.violation = s.describe() + ": " + o.violation;
  o.trace = w.trace();
  o.steps = w.steps();
  return o;
}

}  // namespace ddprun::rounds::sim
