#include "round_rules.hpp"
#include "round_rules_detail.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <spdlog/spdlog.h>

#include "ddprun/common/net.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/common/text.hpp"
#include "rendezvous_error.hpp"
#include "round_state.hpp"
#include "workers_store.hpp"

namespace ddprun::rounds {
namespace {

using namespace detail;

using namespace std::chrono_literals;
using K = RendezvousFailure::Kind;

std::string random_node_id() { return random_hex(16); }

}  // namespace

Self describe_self(const RendezvousOptions& opt, const std::string& reach) {
  Self s;
  s.node_id = random_node_id();
  s.info.host = opt.local_addr.empty() ? host_name() : opt.local_addr;
  s.info.addr = opt.local_addr;
  s.info.reach = reach;
  s.info.nproc = opt.nproc;
  s.info.node_rank = opt.node_rank;
  s.info.addrs = local_addresses();
  return s;
}

RoundRules::RoundRules(const RendezvousOptions& opt, Backend& backend, WorkersStore& workers, Self self,
                       const TimeSource& time)
    : opt_(opt), backend_(backend), time_(time), workers_(workers), self_(std::move(self)), where_(backend.where()) {}

void RoundRules::connect() {
  conn_ = backend_.connect(opt_.join_timeout);
  // The backend's name may have resolved only now (Kubernetes): the route to it is known now.
  if (self_.info.reach.empty()) self_.info.reach = backend_.reach();
  auto& c = *conn_;
  if (auto mark = finished_mark(c)) {
    // A node of the job that arrives late is told; after close_timeout the run id is free again
    // and this is a relaunch: it meets after the old job's rounds.
    const long long now = wall_ms(time_), life = opt_.close_timeout.count();
    const FinishedMark& m = *mark;
    if (now - m.at_ms < life) {
      const std::string relaunch = "a relaunch with it can start " + std::to_string((life - (now - m.at_ms) + 999) / 1000) +
                                   " s from now (close_timeout), or give this job a new --rdzv_id";
      if (m.signal > 0) throw_stop(m.signal, m.host, "; " + relaunch);  // its late nodes are told, as its members were
      throw RendezvousError(K::finished, "rendezvous: run id '" + opt_.run_id + "' already finished on " + where_ + " " +
                                             std::to_string((now - m.at_ms) / 1000) + " s ago; " + relaunch);
    }
    first_round_ = m.round + 2;  // r<round+1>/rc holds the old job's "finished"
    spdlog::info("ddprun: run id '{}' finished {} s ago; starting it again from round {}", opt_.run_id,
                 (now - m.at_ms) / 1000, first_round_);
  }
  // A relaunch's settings are its own, beside the old job's (which may have had others): in its
  // first round, written by the first of its nodes.
  const Key config = first_round_ > 0 ? round_key(first_round_, Name::config) : run_key(Name::config);
  RunConfig mine{opt_.backend, opt_.min_nodes, opt_.max_nodes};
  if (opt_.backend != BackendKind::etcd) {  // (etcd: each node's own lease, watched by etcd)
    mine.keep_alive_ms = opt_.keep_alive_interval.count();
    mine.keep_alive_attempts = opt_.keep_alive_max_attempt;
  }
  if (opt_.max_restarts && opt_.max_same_failures) {
    mine.restart_policy = true;
    mine.max_restarts = *opt_.max_restarts;
    mine.max_same_failures = *opt_.max_same_failures;
  }
  const RunConfig theirs = parse_config(c.name(config), c.create(config, config_json(mine)));
  if (theirs.protocol != mine.protocol) {
    throw RendezvousError(K::in_use, "rendezvous: run id '" + opt_.run_id + "' is in use on " + where_ +
                                         " by nodes of another ddprun version (round records version " +
                                         std::to_string(theirs.protocol) + "; this node: " + std::to_string(mine.protocol) +
                                         "): run the same ddprun on every node of a job");
  }
  if (const auto diff = theirs.differences(mine); !diff.empty()) {
    throw RendezvousError(K::in_use, "rendezvous: run id '" + opt_.run_id + "' is in use on " + where_ +
                                         " by a job with other settings (" + diff + "); give every node of a job "
                                         "the same settings, or this job its own --rdzv_id");
  }
}

RoundRules::Joined RoundRules::join(int round, int rc, const Streak& streak, const StateOffer& state) {
  auto& c = *conn_;
  self_.info.state = state;
  for (;;) {
    // Each round is given join_timeout from when this node arrives in it (a standby node may have
    // waited long for it).
    const auto deadline = time_.now() + opt_.join_timeout;
    throw_if_job_finished();
    if (rc < 0) round = latest_round(std::max(round, first_round_));
    // One restart count per round, the first writer's; "finished": the others ended the job
    // after the round this node comes from (one it did not see end).
    if (rc >= 0 && c.create(round_key(round, Name::rc), std::to_string(rc)) == kFinished) throw_finished();
    // The crash-loop streak likewise: one per round, so that every member decides alike.
    if (rc >= 0) c.create(round_key(round, Name::streak), streak_json(streak));
    if (opt_.backend == BackendKind::static_ranks && !claim_rank(round, deadline)) {
      ++round;  // the round that held this rank has ended: meet in the next one
      continue;
    }
    int idx = static_cast<int>(c.add(round_key(round, Name::join), 1)) - 1;
    told_idx_ = idx;  // first: whoever reads told_ == round reads this arrival too
    told_ = round;
    c.put(round_key(round, Name::node, idx), node_json(self_.info), Lifetime::node);
    spdlog::debug("ddprun: round {}: this node arrived as {} (it last ran in round {} as group rank {})", round, idx,
                  self_.info.last_round, self_.info.last_rank);
    int closed = wait_closed(round, idx, deadline);
    if (closed < 0) {
      ++round;  // abandoned before it closed (a dead holder of a static rank): meet in the next
      continue;
    }
    if (idx < closed) {
      if (auto j = enter_round(round, idx, closed)) return *j;
      ++round;  // given up: meet again in the next one
      continue;
    }
    told_ = kNobody;  // this node is not in the round: a stop here is nobody else's business
    ask_to_join(round, closed);
    wait_next_round(round, closed);
    rc = -1;
    ++round;
  }
}

int RoundRules::round_to_tell(int asked) const {
  int told = told_;
  // A static node is a member only once its claim stood: a duplicate --node_rank (its claim
  // pending or refused) must not stop the round the rank's holder waits in.
  if (told == kNobody || (told < 0 && opt_.backend == BackendKind::static_ranks)) return -1;
  return std::max(told, asked);
}

// Closes round `round` when this arrival (`idx`) fills it, waits until it is closed, and returns
// how many nodes it holds; -1 when it was abandoned (a static rank's holder died in it).
int RoundRules::wait_closed(int round, int idx, Clock::time_point deadline) {
  auto& c = *conn_;
  int expect = opt_.max_nodes;
  const Key ek = round_key(round, Name::expect);
  if (auto e = c.get(ek)) expect = std::clamp(static_cast<int>(parse_number(c.name(ek), *e, 1, kMaxNodes)), 1, opt_.max_nodes);
  const Key closed = round_key(round, Name::closed), joins = round_key(round, Name::join);
  const int n = idx + 1;
  if (n >= opt_.max_nodes || (n >= opt_.min_nodes && n >= expect)) {
    // Full, or every survivor of the last round is back: close now, no last call.
    c.create(closed, closed_json(Closed::of_nodes(std::min(n, opt_.max_nodes))));
  }
  if (n >= opt_.min_nodes) {
    if (!wait_for_others(c, round, time_.now() + opt_.last_call_timeout, false)) {
      // Last call over: close with whoever has arrived.
      int joined = static_cast<int>(std::min<std::int64_t>(c.add(joins, 0), opt_.max_nodes));
      if (joined < n) throw_finished();  // the counter went back: the job finished, its keys were cleared
      c.create(closed, closed_json(Closed::of_nodes(joined)));
    }
  } else if (!wait_for_others(c, round, deadline, true)) {
    throw_if_stopped(c, round);
    // Given up, the round is abandoned (first writer wins): whoever waits in it meets in the next
    // one, and so does a relaunch with this run id, where this node's arrival would count for a
    // node that never comes. Not when MIN have arrived (a last call runs); closed meanwhile,
    // this node is in it after all.
    const int gone = opt_.backend == BackendKind::static_ranks ? opt_.node_rank : idx;
    const std::int64_t joined = c.add(joins, 0);  // (said as read: a node arriving since is not in this decision)
    if (!close_after_last_call(c, round, joined) &&
        parse_closed(c.name(closed), c.create(closed, closed_json(Closed::abandoned(gone)))).kind == Closed::Kind::abandoned) {
      throw RendezvousError(K::timeout, "rendezvous: only " + std::to_string(joined) + " of the " +
                                            std::to_string(opt_.min_nodes) + " nodes needed joined round " +
                                            std::to_string(round) + " on " + where_ + " within " +
                                            duration_text(opt_.join_timeout) +
                                            " (join_timeout); start the other nodes (with this run id, --rdzv_id=" +
                                            opt_.run_id + "), or lower --nnodes" +
                                            (backend_.holds_records()
                                                 ? std::string()
                                                 : " and give the job a new --rdzv_id (this one keeps its settings on " +
                                                       where_ + ")"));
    }
  }
  const Closed result = parse_closed(c.name(closed), existing(c, closed));
  if (result.kind == Closed::Kind::abandoned) return -1;
  if (result.kind == Closed::Kind::stopped) throw_closed_stopped(c, round);
  return result.nodes;
}

// At this node's join_timeout, with MIN nodes arrived meanwhile (`joined_now`, as read then): the
// MIN-th arrival's last call runs, and this node waits it out as that node does, then closes the
// round with whoever has arrived, first writer wins (that node may have died in its last call:
// the round then runs without it, as any round whose member died). False: fewer than MIN arrived.
bool RoundRules::close_after_last_call(Connection& c, int round, std::int64_t joined_now) {
  const Key joins = round_key(round, Name::join);
  if (joined_now < opt_.min_nodes) return false;
  if (!wait_for_others(c, round, time_.now() + opt_.last_call_timeout, false)) {
    const int joined = static_cast<int>(std::min<std::int64_t>(c.add(joins, 0), opt_.max_nodes));
    if (joined < opt_.min_nodes) throw_finished();  // the counter went back: the job finished, its keys were cleared
    c.create(round_key(round, Name::closed), closed_json(Closed::of_nodes(joined)));
  }
  return true;
}

// Waits for round `round` to close until `deadline`; with `look`, it looks every liveness TTL
// (every third of one with static ranks) whether the job finished meanwhile (a node of it
// arriving late is told so, not kept until join_timeout). A static rank's holder shows it is
// alive meanwhile, every third of a TTL (the store has no other sign of its life before a round
// runs): claim_rank abandons a round whose holder went silent, so that the rank's replacement
// can meet in the next. With `look`, it says how many have joined after 10 s, then every minute.
bool RoundRules::wait_for_others(Connection& c, int round, Clock::time_point deadline, bool look) {
  const Key closed = round_key(round, Name::closed);
  const bool held = opt_.backend == BackendKind::static_ranks;
  Clock::duration slice = deadline - time_.now();  // one wait, unless there is something to do between
  if (held) {
    slice = backend_.liveness_ttl() / 3;
  } else if (look) {
    slice = backend_.liveness_ttl();
  }
  auto say_at = time_.now() + std::chrono::seconds(10);
  for (;;) {
    if (held) c.add(round_key(round, Name::held, opt_.node_rank), 1);
    if (c.wait({closed}, std::min({deadline, time_.now() + slice, look ? say_at : deadline}))) return true;
    if (time_.now() >= deadline) return false;
    if (look && time_.now() >= say_at) {
      say_waiting(c, round, deadline);
      say_at = time_.now() + std::chrono::seconds(60);
    }
    if (look) throw_if_job_finished();
  }
}

// One line while a node waits for the nodes a round needs: how many have joined; static node 0
// (the store's usual host, whose log is read first) names the node ranks missing, in one read.
void RoundRules::say_waiting(Connection& c, int round, Clock::time_point deadline) {
  const auto joined = std::min<std::int64_t>(c.add(round_key(round, Name::join), 0), opt_.max_nodes);
  if (joined >= opt_.min_nodes) {
    spdlog::info("ddprun: waiting for round {} of run id '{}' on {} to close: {} nodes have joined ({} needed), and a "
                 "last call runs (last_call_timeout)", round, opt_.run_id, where_, joined, opt_.min_nodes);
    return;
  }
  std::string missing;
  // (up to 1,024 ranks: one read of a few tens of kB, not one a store would refuse)
  if (opt_.backend == BackendKind::static_ranks && opt_.node_rank == 0 && opt_.max_nodes <= 1024) {
    std::vector<Key> ranks;
    for (int r = 0; r < opt_.max_nodes; ++r) ranks.push_back(round_key(round, Name::rank, r));
    const auto held = c.get_many(ranks);
    int absent = 0;
    for (int r = 0; r < opt_.max_nodes; ++r) {
      if (held[r]) continue;
      if (++absent <= 8) missing += (absent == 1 ? "" : ", ") + std::to_string(r);
    }
    if (absent > 8) missing += " and " + std::to_string(absent - 8) + " more";
    if (absent > 0) missing = "; missing --node_rank " + missing;
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - time_.now());
  spdlog::info("ddprun: waiting for nodes: {} of the {} needed have joined round {} of run id '{}' on {}{}; {} left (join_timeout)",
               joined, opt_.min_nodes, round, opt_.run_id, where_, missing,
               duration_text(std::max(left, std::chrono::milliseconds(0))));
}

// Runs round `round` as its idx-th arrival, or gives it up (nullopt) when a member never came to
// run it (died while joining): then the next round expects the others.
std::optional<RoundRules::Joined> RoundRules::enter_round(int round, int idx, int closed) {
  auto& c = *conn_;
  const Key sk = round_key(round, Name::store);
  for (bool again = false;; again = true) {
    // Even when the others ended the round meanwhile (a member's workers failed at once): its
    // end is this node's to act on too (no restart left ends the job on every node), which it
    // learns by running the round; it must never skip it.
    auto read = read_round(round, idx, closed);
    if (auto* j = std::get_if<Joined>(&read)) return std::move(*j);
    const MemberGone& g = std::get<MemberGone>(read);
    // Given up first-writer-wins on the round's store key, against group rank 0's address: a
    // round runs with the address or never (no member starts its workers without it), so a
    // member that was only late cannot be running when the end says it was lost. Rank 0
    // first: the round runs after all; read it again (a record gone since is a lost lease).
    StoreAddress mark;
    mark.gone = g.index;
    const StoreAddress s = parse_store(c.name(sk), c.create(sk, store_json(mark)));
    if (s.stopped) throw_stopped(c, round);
    if (s.gone < 0 && !again) continue;
    // The end names the member by group rank (-1 where no lineup was written yet).
    const Seat gone = lineup_seat(round, closed, g.index);
    const std::string host = g.host != "?" ? g.host : gone.host;
    spdlog::warn("ddprun: round {}: the node that arrived {} ({}) {}; meeting again without it", round, g.index,
                 escape_for_log(host), g.what);
    c.create(round_key(round + 1, Name::expect), std::to_string(std::max(closed - 1, 1)));
    c.create(round_key(round, Name::end), round_end_json(RoundEnd::of_node_lost(gone.group_rank, host, 0)));
    return std::nullopt;
  }
}

// In round `round` as its idx-th arrival: this node's place, as its assignment says; or a member
// gone before the round ran.
std::variant<RoundRules::Joined, RoundRules::MemberGone> RoundRules::read_round(int round, int idx, int closed) {
  auto& c = *conn_;
  const Key ak = round_key(round, Name::assign, idx);
  Placed p = own_assignment(round, idx, closed);
  if (p.gone) return *p.gone;
  const std::string& mine = p.mine;
  // Read after the assignment: a job that finished and cleared its rounds (etcd) before they
  // were written is seen here, and a node of it that was stopped meanwhile does not start it again.
  throw_if_job_finished();
  const Assignment a = parse_assignment(c.name(ak), mine);
  if (a.stopped) throw_stopped(c, round);
  if (!a.refused.empty()) throw RendezvousError(K::usage, a.refused);
  if (a.group_rank >= closed || a.next >= closed || a.holders > closed) {
    throw ProtocolError("rendezvous: " + c.name(ak) + " names group rank " + std::to_string(a.group_rank) +
                        " or next member " + std::to_string(a.next) + " (or " + std::to_string(a.holders) +
                        " members holding state), beyond the round's " + std::to_string(closed));
  }
  if (a.rc == kFinished) throw_finished();
  Joined j;
  RoundInfo& info = j.info;
  info.round = round;
  info.group_world = closed;
  info.group_rank = a.group_rank;
  info.rank_offset = a.offset;
  info.world_size = a.world;
  info.restart_count = static_cast<int>(parse_number(c.name(round_key(round, Name::rc)), a.rc, 0, INT32_MAX));
  info.streak = parse_streak(c.name(ak), a.streak);
  if (a.group_rank == 0) info.nodes = std::move(p.nodes);  // the assigner's, when it is group rank 0
  j.members.round = round;
  j.members.group_rank = a.group_rank;
  j.members.group_world = closed;
  j.members.next_record = round_key(round, Name::node, a.next);
  j.members.next_host = a.next_host;
  info.next_state_link = a.next_link;
  info.state_holders = a.holders;
  info.holds_state = self_.info.state.holds;
  if (auto gone = publish_store(j)) return *gone;
  // The round runs: this node's place in it is the one the next round keeps for it.
  self_.info.last_round = round;
  self_.info.last_rank = a.group_rank;
  return j;
}

// The workers' store: hosted by group rank 0 (emptied for the round), published, read by all.
// Group rank 0 reads every member's record for its allow-list (one read), unless it assigned.
// A member gone (rank 0 silent, a record gone, or given up by another member) is returned.
std::optional<RoundRules::MemberGone> RoundRules::publish_store(Joined& j) {
  auto& c = *conn_;
  RoundInfo& info = j.info;
  const Key k = round_key(info.round, Name::store);
  if (info.group_rank == 0) {
    if (info.nodes.empty()) {
      std::vector<int> order;
      const Arrivals arrivals = read_arrivals(info.round, info.group_world, true, true);
      if (arrivals.gone) return arrivals.gone;
      const std::string refused = order_members(arrivals.nodes, info.nodes, order);
      if (!refused.empty()) throw ProtocolError(refused + " (in a round already assigned)");
    }
    // First writer wins: a member may have given the round up (or a stop ended it) first.
    c.create(k, store_json(workers_.host(info)));
  } else {
    workers_.release();
  }
  if (!c.wait({k}, time_.now() + opt_.read_timeout)) {
    // Group rank 0's arrival, from the lineup; where it cannot be read, arrival 0 stands for it
    // (the mark only has to name someone: any member's verdict gives the round up).
    const Seat zero = lineup_seat(info.round, info.group_world, -1);
    return MemberGone{std::max(zero.arrival, 0), zero.host,
                      "did not publish the workers' store within " + duration_text(opt_.read_timeout)};
  }
  const StoreAddress s = parse_store(c.name(k), existing(c, k));
  if (s.stopped) throw_stopped(c, info.round);
  if (s.gone >= 0) return MemberGone{s.gone, "?", "was given up by another member before the round ran"};
  info.store_host = s.host;
  info.store_port = s.port;
  return std::nullopt;
}

void RoundRules::end_round(int round, RoundEnd why, int expect_next) {
  if (why.kind == RoundEnd::Kind::stopped) why.by = self_.node_id;
  if (expect_next > 0) conn_->create(round_key(round + 1, Name::expect), std::to_string(expect_next));
  conn_->create(round_key(round, Name::end), round_end_json(why));
}

void RoundRules::report_success(int round, int group_world) {
  const std::int64_t n = conn_->add(round_key(round, Name::succeeded), 1);
  if (n == group_world) {
    conn_->create(round_key(round, Name::end), round_end_json(RoundEnd::of_success()));
  } else if (n < 0 && ((n % kRequest) + kRequest) % kRequest == group_world) {
    // A node asked to join before the last report: the round restarts with it (its request may
    // not have been written: it could have died since).
    conn_->create(round_key(round, Name::end), round_end_json(RoundEnd::of_membership("?")));
  }
}

void RoundRules::acknowledge_end(int round, int group_world, bool succeeded) {
  auto& c = *conn_;
  const Key all = round_key(round, Name::all_acked);
  const bool last = c.add(round_key(round, Name::acked), 1) >= group_world;
  if (last) c.put(all, "1");
  // The job is over from the first acknowledgement on: a node of it that starts again (or a
  // member that never acknowledges: it crashed) must find it finished, not a new round. Every
  // acknowledgement writes the marker (the first one's node may crash between counting and
  // writing), the last one before clearing the run (clear_run keeps it): nothing of the job stays
  // but markers, so a node started late with this run id is told the job finished, and one
  // waiting for a place in a next round learns there is none.
  c.put(run_key(Name::finished), finished_json(FinishedMark{round, wall_ms(time_), succeeded}), Lifetime::marker);
  if (last) c.clear_run();
  c.create(round_key(round + 1, Name::rc), kFinished, Lifetime::marker);
  // The records must outlive the others' last reads; bounded (close_timeout), it is no exit
  // barrier: normally every node acknowledges within milliseconds.
  if (backend_.holds_records() && !c.wait({all}, time_.now() + opt_.close_timeout)) {
    spdlog::debug("ddprun: not every node acknowledged the end of round {}", round);
  }
}

std::optional<RoundEnd> RoundRules::end_by(Connection& c, int round, Clock::time_point deadline) {
  const Key end = round_key(round, Name::end);
  if (c.wait({end}, deadline)) {
    if (auto v = c.get(end)) return parse_round_end(c.name(end), *v);
  }
  if (time_.now() < deadline || !finished_since(c, round)) return std::nullopt;
  // The end is written before the marker: it may have come since the wait. Gone: cleared (etcd).
  if (auto v = c.get(end)) return parse_round_end(c.name(end), *v);
  throw_finished("was away from its round (its records are gone)");
}

RoundEnd RoundRules::wait_end(Connection& c, int round) {
  for (;;) {
    if (auto e = end_by(c, round, time_.now() + backend_.liveness_ttl())) return *e;
  }
}

}  // namespace ddprun::rounds
