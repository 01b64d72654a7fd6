// The round rules for a stop during the rendezvous: announced by the node that was signalled,
// read (and acknowledged) by the nodes waiting in the round (round_rules.hpp).
#include <csignal>
#include <spdlog/spdlog.h>

#include "ddprun/common/system.hpp"
#include "rendezvous_error.hpp"
#include "round_rules.hpp"
#include "round_rules_detail.hpp"
#include "round_state.hpp"

namespace ddprun::rounds {

using namespace std::chrono_literals;
using namespace detail;
using K = RendezvousFailure::Kind;

void RoundRules::throw_if_stopped(Connection& c, int round, bool member) {
  const Key end = round_key(round, Name::end);
  auto v = c.get(end);
  if (!v) return;
  const RoundEnd e = parse_round_end(c.name(end), *v);
  if (e.kind != RoundEnd::Kind::stopped) return;
  // Acknowledge: the last of the joined nodes (all but the one that stopped) releases the node
  // holding the records. The node that stopped the round does not acknowledge its own stop, nor
  // does a node that never arrived in it (it is not counted).
  if (member && e.by != self_.node_id) {
    try {
      auto joined = c.add(round_key(round, Name::join), 0);
      if (c.add(round_key(round, Name::stop_acks), 1) >= joined - 1) c.put(round_key(round, Name::stop_seen), "1");
    } catch (const Error&) {
      // The records are gone already: the stop is known, which is all that matters here.
    }
  }
  throw_stop(e.signal > 0 ? e.signal : SIGTERM, e.host, "");
}

// The job was stopped during the rendezvous by `signal` on `host`, as a round's end or the
// finished mark says (`then`: what follows).
void RoundRules::throw_stop(int signal, const std::string& host, const std::string& then) {
  throw RendezvousError(K::stopped, "the job was stopped by " + signal_name(signal) + " on host " + host +
                                        " during the rendezvous" + then, signal);
}

// Round `round` was stopped: who stopped it and with what signal, when its end says so.
void RoundRules::throw_stopped(Connection& c, int round, bool member) {
  throw_if_stopped(c, round, member);
  throw RendezvousError(K::stopped, "the job was stopped during the rendezvous", SIGTERM);
}

// Round `round` was closed as stopped: the stopping node closes it first, then writes who
// stopped it and with what signal (its end), which is waited for briefly.
void RoundRules::throw_closed_stopped(Connection& c, int round, bool member) {
  c.wait({round_key(round, Name::end)}, time_.now() + std::min<Clock::duration>(opt_.read_timeout, 2s));
  throw_stopped(c, round, member);
}

void RoundRules::announce_stop(Connection& c, int round, int signal) {
  // Close the round as stopped, if it is not closed yet: its nodes wait for this one. A round
  // already closed is ended only by one of its members: a node outside it (counted lost, or
  // still on its way) must not stop a group that runs without it.
  const std::string stop = closed_json(Closed::stopped());
  const std::string stood = c.create(round_key(round, Name::closed), stop);
  int members = 0;  // the round's members, when it closed with this node in it
  if (stood != stop) {
    const Closed closed = parse_closed(c.name(round_key(round, Name::closed)), stood);
    // Its nodes went on to the next round (this one too, after this call): they wait there.
    // Abandoned before it closed: its nodes, this one too, meet in the next round; tell them there.
    if (closed.kind == Closed::Kind::abandoned) return announce_stop(c, round + 1, signal);
    const int idx = told_ == round ? told_idx_.load() : -1;
    if (closed.kind == Closed::Kind::nodes && (idx < 0 || idx >= closed.nodes)) return;
    if (closed.kind == Closed::Kind::nodes) members = closed.nodes;
  }
  c.create(round_key(round, Name::end), round_end_json(RoundEnd::of_stop(signal, self_.info.host, self_.node_id)));
  // Wake whoever waits for its workers' store.
  StoreAddress stopped;
  stopped.stopped = true;
  c.create(round_key(round, Name::store), store_json(stopped));
  // And whoever waits for its place (this node may be the round's assigner): an assignment
  // already written stands, and leads its member to the store's stop.
  Assignment none;
  none.stopped = true;
  for (int i = 0; i < members; ++i) c.create(round_key(round, Name::assign, i), assignment_json(none));
  // Stopped before it ran, the job is over, as one that ran is once its members acknowledge the
  // end: the marker tells a late node so, and lets a relaunch with this run id meet after
  // close_timeout (the stopped round would stop it forever). Unless a mark of this job's end, or
  // of a later one, stands (a late announce, its job over): it is not moved back.
  bool ends_job = false;
  if (stood == stop) {
    const auto m = finished_mark(c);
    ends_job = !m || m->round + 2 <= round;
    FinishedMark stopped{round, wall_ms(time_), false, signal, self_.info.host};
    if (ends_job) c.put(run_key(Name::finished), finished_json(stopped), Lifetime::marker);
  }
  // etcd keeps a run's keys: once the waiting nodes read the stop, they go, as after a job's last
  // acknowledgement (the marker's lease is 10 minutes: a relaunch after it must not find the
  // stopped round). A store's go with its host, or stay with the marker before them.
  const bool clear = ends_job && opt_.backend == BackendKind::etcd;
  if (backend_.holds_records() || clear) {
    bool others = c.add(round_key(round, Name::join), 0) > 1;
    if (!c.wait({round_key(round, Name::stop_seen)}, time_.now() + (others ? 1500ms : 300ms))) {
      spdlog::debug("ddprun: not every node acknowledged the stop of round {}", round);
    }
  }
  if (clear) c.clear_run();
  if (ends_job) c.create(round_key(round + 1, Name::rc), kFinished, Lifetime::marker);
}

// The job's round `round` was stopped before it ran (its `closed` says so, not only its end: a
// stop while it ran ends it "stopped" too, and its members then acknowledged a finished job).
bool RoundRules::stopped_before_run(Connection& c, int round) {
  const Key k = round_key(round, Name::closed);
  auto v = c.get(k);
  return v && parse_closed(c.name(k), *v).kind == Closed::Kind::stopped;
}

}  // namespace ddprun::rounds
