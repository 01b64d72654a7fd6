// The round rules for a node outside a running round: finding the latest round, waiting beside
// a running round as a standby node (or asking it to restart with this node in), static rank claims,
// and members that are all gone (round_rules.hpp).
#include <spdlog/spdlog.h>

#include "ddprun/common/text.hpp"
#include "rendezvous_error.hpp"
#include "round_rules.hpp"
#include "round_rules_detail.hpp"
#include "round_state.hpp"

namespace ddprun::rounds {

using namespace std::chrono_literals;
using namespace detail;
using K = RendezvousFailure::Kind;

// The latest round any node arrived in, from `from` on: arrivals in round R+1 begin only once
// round R has had its own, so the first round without arrivals ends the search. A key that only
// grows, never one that a late writer could move back.
int RoundRules::latest_round(int from) {
  auto& c = *conn_;
  int round = std::max(from, 0);
  while (c.get(round_key(round + 1, Name::join))) ++round;
  return round;
}

// Outside a running round: the next one begins when this one has ended and its members go on
// (the first to join the next round writes its restart count), never beside it; a job that
// ends instead leaves "finished" there.
// Members that are all gone (a crashed launch left its keys) are not waited for: once none
// renewed its liveness for a TTL plus twice read_timeout (members on their way into the round
// renew only once it runs), this node ends the round and meets in the next one.
void RoundRules::wait_next_round(int round, int closed) {
  auto& c = *conn_;
  const Key next = round_key(round + 1, Name::rc);
  const auto ttl = backend_.liveness_ttl(), patience = ttl + 2 * opt_.read_timeout;
  std::vector<long long> seen;
  auto alive_at = time_.now();
  while (!c.wait({next}, time_.now() + ttl)) {
    throw_if_finished(c, round);
    if (ended_without_count(c, round)) return;
    if (!backend_.members_silent(c, round, closed, seen)) {
      alive_at = time_.now();
    } else if (time_.now() - alive_at >= patience) {
      spdlog::warn("ddprun: round {}: none of its {} nodes renewed its liveness for {}; meeting in the next round "
                   "without them", round, closed, duration_text(std::chrono::duration_cast<std::chrono::milliseconds>(patience)));
      c.create(round_key(round, Name::end), round_end_json(RoundEnd::of_node_lost(0, "?", 0)));
      return;
    }
  }
  if (c.get(next).value_or("") == kFinished) throw_finished();
}

// Round `round` ended "node lost" or "membership": no restart is counted and the job goes on,
// so this node meets in the next round now. Its members may never write that round's count
// (one that found a member gone before the round ran goes on as a node new to the job), and
// waiting for it kept a standby node beside a round nobody would run again.
bool RoundRules::ended_without_count(Connection& c, int round) {
  const Key end = round_key(round, Name::end);
  auto v = c.get(end);
  if (!v) return false;
  const auto kind = parse_round_end(c.name(end), *v).kind;
  if (kind != RoundEnd::Kind::node_lost && kind != RoundEnd::Kind::membership) return false;
  // The next round goes on with this one's restart count and streak, as its members would bring
  // them: this node may close it before they arrive (they are still stopping their workers).
  if (auto rc = c.get(round_key(round, Name::rc))) {
    if (c.create(round_key(round + 1, Name::rc), *rc) == kFinished) throw_finished();
  }
  if (auto s = c.get(round_key(round, Name::streak))) c.create(round_key(round + 1, Name::streak), *s);
  return true;
}

// The value of a key this node saw written: gone only when the job finished and its keys were
// cleared (etcd) while this node was slow.
std::string RoundRules::existing(Connection& c, const Key& k) {
  auto v = c.get(k);
  if (!v) throw_finished();
  return *v;
}

void RoundRules::throw_finished(const char* while_) {
  // Outside the job's rounds (a standby node beyond MAX), a job that succeeded left it nothing to
  // do, and nothing that failed: its exit is the job's (a scheduler counts the step).
  std::optional<FinishedMark> m;
  if (told_ == kNobody && opt_.backend != BackendKind::static_ranks && conn_) {
    try {
      m = finished_mark(*conn_);
    } catch (const Error&) {
    }
  }
  const bool done = m && m->succeeded;
  throw RendezvousError(done ? K::done : K::finished, "rendezvous: the job of run id '" + opt_.run_id + "' on " +
                                                          where_ + (done ? " succeeded" : " finished") +
                                                          " while this node " + while_ +
                                                          (done ? ": nothing was left for it to do" : ""));
}

// The run's finished marker, if it has one.
std::optional<FinishedMark> RoundRules::finished_mark(Connection& c) {
  const Key finished = run_key(Name::finished);
  auto v = c.get(finished);
  if (!v) return std::nullopt;
  return parse_finished(c.name(finished), *v, wall_ms(time_));
}

// The job finished in round `round` or later (its keys may be cleared already).
bool RoundRules::finished_since(Connection& c, int round) {
  auto m = finished_mark(c);
  return m && m->round >= round;
}

void RoundRules::throw_if_finished(Connection& c, int round, const char* while_) {
  if (finished_since(c, round)) throw_finished(while_);
}

// The job this node belongs to finished since connect() looked (a relaunch meets after the
// rounds of the job before it, first_round_): a node of it, however late, must not start it again
// (etcd: clear_run took the rounds' keys, the marker stays).
void RoundRules::throw_if_job_finished() {
  auto m = finished_mark(*conn_);
  if (!m || m->round + 2 <= first_round_) return;
  // (stopped before its round ran: the stop is what its nodes are told, as those waiting in it;
  // from the mark where etcd cleared the round)
  if (stopped_before_run(*conn_, m->round)) throw_if_stopped(*conn_, m->round, told_ == m->round);
  if (m->signal > 0) throw_stop(m->signal, m->host, "");
  throw_finished();
}

// The round runs without this node: with room, it is asked to restart with this node in.
void RoundRules::ask_to_join(int round, int closed) {
  auto& c = *conn_;
  if (closed < opt_.max_nodes) {
    const std::int64_t reported = c.add(round_key(round, Name::succeeded), -kRequest) + kRequest;
    if (reported >= closed) {
      // Every member had succeeded first: the job ends; help the last one say so.
      c.create(round_key(round, Name::end), round_end_json(RoundEnd::of_success()));
      return;
    }
    c.create(round_key(round + 1, Name::expect), std::to_string(closed + 1));
    c.create(round_key(round, Name::end), round_end_json(RoundEnd::of_membership(self_.info.host, time_.wall())));
    spdlog::info("ddprun: round {} runs with {} nodes; asking it to restart with this one", round, closed);
  } else {
    if (!said_standby_) {
      said_standby_ = true;
      spdlog::info("ddprun: round {} is full ({} of {} nodes); this node waits for a place (run id '{}': if this is "
                   "another job, give it its own --rdzv_id)", round, closed, opt_.max_nodes, opt_.run_id);
    }
    if (on_waiting_) on_waiting_();
  }
}

// Static: --node_rank N is claimed first-writer-wins (etcd: on the claimer's lease), and its
// holder bumps r<R>/held/<N> from then on until the round closes, and its keep-alive counter
// r<R>/alive/<N> while the round runs (the store's ring; group rank = node rank). Either counter
// moving between two looks of a refused claimer, a little over a third of a TTL apart (the
// holder bumps `held` every third), shows the holder alive: a duplicate --node_rank, refused at
// once. Else held by a live member of a running round: refused once the liveness TTL has shown
// its members alive. Held by a node that died on its way: the round ends without it once it
// closed; before it closed, the round is abandoned once the holder's `held` counter stayed still
// for a TTL plus twice read_timeout. False: the round ended or was abandoned, try the next one.
bool RoundRules::claim_rank(int round, Clock::time_point deadline) {
  auto& c = *conn_;
  const Key k = round_key(round, Name::rank, opt_.node_rank), end = round_key(round, Name::end);
  const Key ck = round_key(round, Name::closed);
  const std::string mine = claim_json({self_.node_id, self_.info.host});
  const RankClaim holder = parse_claim(c.name(k), c.create(k, mine, Lifetime::node));
  HolderWatch held{round_key(round, Name::held, opt_.node_rank)}, beat{round_key(round, Name::alive, opt_.node_rank)};
  if (holder.node_id == self_.node_id) {
    c.add(held.counter, 1);  // alive from the claim on: a pause before arriving is not death
    told_idx_ = -1;  // the holder: the others wait for it in this round, where it arrives next
    told_ = round;
    return true;
  }
  told_ = kNobody;  // refused: a member of no round (a stop of this node is nobody else's business)
  moved(held);
  moved(beat);
  // With no counter of the holder's moving (etcd has no keep-alive counters), a running round's
  // members are watched by members_gone() for a TTL once 1 s has passed: refused then.
  const auto ttl = backend_.liveness_ttl(), patience = std::chrono::milliseconds(1s), look = ttl / 3 + ttl / 10;
  const auto since = time_.now();
  for (;;) {
    if (c.wait({end}, std::min(deadline, time_.now() + look))) {
      throw_if_stopped(c, round, false);  // the job is stopping: so is this node of it
      // The holder's round succeeded: the job is over, and this node was a duplicate (meeting in
      // the next round, it would wait for a job that is gone).
      if (const auto e = c.get(end); e && parse_round_end(c.name(end), *e).kind == RoundEnd::Kind::success) {
        throw RendezvousError(K::in_use, "rendezvous: node rank " + std::to_string(opt_.node_rank) + " was held by " +
                                             holder.host + " in round " + std::to_string(round) + " of run '" + opt_.run_id +
                                             "' on " + where_ + ", whose job finished while this node waited; give each "
                                             "node its own --node_rank (0.." + std::to_string(opt_.max_nodes - 1) +
                                             "), or a new job its own --rdzv_id");
      }
      return false;
    }
    const bool waited = time_.now() - since >= patience, running = c.get(round_key(round, Name::store)).has_value();
    const auto cv = running ? std::nullopt : c.get(ck);
    const auto kind = cv ? parse_closed(c.name(ck), *cv).kind : Closed::Kind::nodes;
    if (cv && kind == Closed::Kind::abandoned) return false;
    if (cv && kind == Closed::Kind::stopped) throw_closed_stopped(c, round, false);
    const bool closed = running || cv.has_value();
    const auto last = held.looked_at;
    auto within = [&] { return duration_text(std::chrono::duration_cast<std::chrono::milliseconds>(time_.now() - last)); };
    if (moved(held)) throw_held(round, holder.host, "its held counter moved within the last " + within());
    if (moved(beat)) throw_held(round, holder.host, "its keep-alive counter moved within the last " + within());
    // A closed round whose members all died on their way in (a crashed launch) is ended too.
    if (waited && closed && members_gone(round)) return false;  // it ended the round: try the next one
    // The claim is on the holder's lease (etcd): gone, the holder is, and its round ends without
    // it (the member before it watches its record): wait for that end.
    if (waited && running && c.get(k)) throw_held(round, holder.host, "its round runs, its members renewing their liveness");
    if (!closed && holder_gone(round, held)) {
      spdlog::warn("ddprun: node rank {} is held in round {} by host {}, which stopped showing it is alive before the "
                   "round closed; meeting in the next round", opt_.node_rank, round, escape_for_log(holder.host));
      return false;
    }
    if (time_.now() >= deadline) {
      throw_held(round, holder.host, "it did not go within " + duration_text(opt_.join_timeout) + " (join_timeout)");
    }
  }
}

// Looks at a counter of the holder's: true when it changed since the last look (the first look
// only notes it).
bool RoundRules::moved(HolderWatch& w) {
  const long long count = conn_->add(w.counter, 0);
  const bool changed = count != w.count, seen = w.count >= 0;
  w.looked_at = time_.now();
  if (changed) {
    w.count = count;
    w.alive_at = w.looked_at;
  }
  return changed && seen;
}

[[noreturn]] void RoundRules::throw_held(int round, const std::string& host, const std::string& alive) {
  throw RendezvousError(K::in_use, "rendezvous: node rank " + std::to_string(opt_.node_rank) + " is already held by " + host +
                                       " (alive: " + alive + ") in round " + std::to_string(round) + " of run '" + opt_.run_id +
                                       "' on " + where_ + "; give each node its own --node_rank (0.." +
                                       std::to_string(opt_.max_nodes - 1) + "), or a new job its own --rdzv_id");
}

// The holder of this node's rank, in round `round` (not closed), did not bump its `held`
// counter for a TTL plus twice read_timeout: it died on its way in. Then the round is abandoned
// (first writer wins on its `closed` key: a round that closed meanwhile goes on, and is ended as
// any round whose member died), and true.
bool RoundRules::holder_gone(int round, const HolderWatch& w) {
  auto& c = *conn_;
  if (time_.now() - w.alive_at < backend_.liveness_ttl() + 2 * opt_.read_timeout) return false;
  const Key ck = round_key(round, Name::closed);
  return parse_closed(c.name(ck), c.create(ck, closed_json(Closed::abandoned(opt_.node_rank)))).kind ==
         Closed::Kind::abandoned;
}

// Every member of the running round `round` stayed silent for a TTL plus twice read_timeout
// (a crashed launch left it): then this node ends it, and true.
bool RoundRules::members_gone(int round) {
  auto& c = *conn_;
  const Key ck = round_key(round, Name::closed);
  const Closed closed = parse_closed(c.name(ck), existing(c, ck));
  const auto ttl = backend_.liveness_ttl(), patience = ttl + 2 * opt_.read_timeout;
  std::vector<long long> seen;
  const auto since = time_.now();
  backend_.members_silent(c, round, closed.nodes, seen);
  while (!c.wait({round_key(round, Name::end)}, time_.now() + ttl)) {
    if (!backend_.members_silent(c, round, closed.nodes, seen)) return false;
    if (time_.now() - since >= patience) {
      c.create(round_key(round, Name::end), round_end_json(RoundEnd::of_node_lost(0, "?", 0)));
      return true;
    }
  }
  return true;
}

}  // namespace ddprun::rounds
