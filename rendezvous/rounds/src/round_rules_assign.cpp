// The round rules' assignment (round_rules.hpp): one node reads the records of a closed round's
// members and writes each member its place (r<R>/assign/<i>) and the lineup (r<R>/members);
// every other member reads its own assignment only: O(1) requests and bytes, whatever the
// round's size (docs/rounds-protocol.md, "Cost per round").
#include <algorithm>

#include <spdlog/spdlog.h>

#include "ddprun/common/text.hpp"
#include "rendezvous_error.hpp"
#include "round_rules.hpp"
#include "round_rules_detail.hpp"
#include "round_state.hpp"

namespace ddprun::rounds {

using namespace detail;

// The records of the round's `closed` arrivals, in arrival order: one wait naming them all (up
// to read_timeout; none with `at_once`, or once they were `assigned`), one read of them all.
// The first member that never came or went with its lease is `gone`.
RoundRules::Arrivals RoundRules::read_arrivals(int round, int closed, bool at_once, bool assigned) {
  auto& c = *conn_;
  std::vector<Key> records;
  for (int i = 0; i < closed; ++i) records.push_back(round_key(round, Name::node, i));
  const bool came = assigned || (!at_once && c.wait(records, time_.now() + opt_.read_timeout));
  // A record on a lease (etcd) goes with a member that died since the wait.
  const auto values = c.get_many(records);
  Arrivals arrivals;
  for (int i = 0; i < closed; ++i) {
    if (!values[i]) {
      arrivals.gone = MemberGone{i, assigned ? lineup_seat(round, closed, i).host : "?",
                                 (came ? "was lost as the round closed"
                                       : "did not describe itself within " + duration_text(opt_.read_timeout)) +
                                     c.missing_why(records[i])};
      arrivals.nodes.clear();
      return arrivals;
    }
    arrivals.nodes.push_back(parse_node(c.name(records[i]), *values[i]));
  }
  return arrivals;
}

// The members by group rank, and their arrival indices. Static: by --node_rank, each unique and
// below the round's size. Otherwise each member keeps the group rank it last ran with (its
// workers' places, their in-memory state and its buddy stay put), where that is below the
// round's size and no member ran with it in a later round (in the same one: the earlier
// arrival); the others take the free places in arrival order. Returns why the records cannot
// make a round ("" when they can; then `nodes` is empty).
std::string RoundRules::order_members(const std::vector<NodeInfo>& arrivals, std::vector<NodeInfo>& nodes,
                                      std::vector<int>& order) const {
  const int closed = static_cast<int>(arrivals.size());
  nodes.resize(closed);
  order.assign(closed, -1);
  if (opt_.backend != BackendKind::static_ranks) {
    std::vector<int> keep;  // arrivals that name a place, the latest round first
    for (int i = 0; i < closed; ++i) {
      if (arrivals[i].last_rank >= 0 && arrivals[i].last_rank < closed) keep.push_back(i);
    }
    std::stable_sort(keep.begin(), keep.end(),
                     [&](int a, int b) { return arrivals[a].last_round > arrivals[b].last_round; });
    std::vector<bool> placed(closed, false);
    for (int i : keep) {
      if (order[arrivals[i].last_rank] < 0) order[arrivals[i].last_rank] = i, placed[i] = true;
    }
    for (int i = 0, g = 0; i < closed; ++i) {
      if (placed[i]) continue;
      while (order[g] >= 0) ++g;
      order[g] = i;
    }
    for (int g = 0; g < closed; ++g) nodes[g] = arrivals[order[g]];
    return "";
  }
  for (int i = 0; i < closed; ++i) {
    const NodeInfo& n = arrivals[i];
    if (n.node_rank < 0 || n.node_rank >= closed || order[n.node_rank] >= 0) {
      nodes.clear();
      return "rendezvous: node_rank " + std::to_string(n.node_rank) + " (host " + n.host +
             ") is out of range or used twice; give each node a distinct --node_rank in 0.." + std::to_string(closed - 1);
    }
    order[n.node_rank] = i;
    nodes[n.node_rank] = n;
  }
  return "";
}

// Round `round`'s member with arrival index `arrival` (-1: the one at group rank 0), as its
// lineup names it, for a message: the lineup read only now that a member is lost. What cannot be
// read stays unknown (-1, "?").
RoundRules::Seat RoundRules::lineup_seat(int round, int closed, int arrival) {
  const Key mk = round_key(round, Name::members);
  try {
    if (auto v = conn_->get(mk)) {
      const Lineup l = parse_lineup(conn_->name(mk), *v, closed);
      for (int g = 0; g < closed; ++g) {
        if (arrival < 0 ? g == 0 : l.arrivals[g] == arrival) return {l.arrivals[g], g, l.hosts[g]};
      }
    }
  } catch (const Error& e) {
    spdlog::debug("ddprun: reading {}: {}", conn_->name(mk), e.what());
  }
  return {arrival, -1, "?"};
}

// Every member's place in round `round`, computed from the records and written for all: by the
// round's last member, which overwrites (one request: the values are a function of the records,
// which never change, and of the count and streak that stand), or by a stand-in for it, which
// creates (first writer wins). Each member's assignment holds all it reads of the round; the
// lineup (every member's host) is written beside them, for messages. Returns what stands for
// this node (`idx`), and the records by group rank.
RoundRules::Placed RoundRules::assign(int round, int idx, int closed, bool stand_in) {
  auto& c = *conn_;
  // A stand-in comes read_timeout after the round closed: a record missing now never came.
  Placed p;
  Lineup lineup;
  const Arrivals arrivals = read_arrivals(round, closed, stand_in);
  if (arrivals.gone) {
    p.gone = arrivals.gone;
    return p;
  }
  const std::string refused = order_members(arrivals.nodes, p.nodes, lineup.arrivals);
  // The round's count and streak, the same on every member (a node new to the job has none of
  // its own). Both read with a create: a node that is not a member (it arrives late) cannot
  // change them after.
  const Key rck = round_key(round, Name::rc), sk = round_key(round, Name::streak);
  const std::string rc = c.create(rck, "0");
  if (rc != kFinished) parse_number(c.name(rck), rc, 0, INT32_MAX);
  const std::string streak = streak_json(parse_streak(c.name(sk), c.create(sk, streak_json(Streak{}))));
  std::vector<Key> keys;
  std::vector<std::string> values;
  if (refused.empty()) {
    for (const auto& n : p.nodes) lineup.hosts.push_back(n.host);
    keys.push_back(round_key(round, Name::members));
    values.push_back(lineup_json(lineup));
  }
  int world = 0, offset = 0, holders = 0;
  for (const auto& n : p.nodes) world += n.nproc, holders += n.state.holds ? 1 : 0;
  for (int g = 0; g < closed; ++g) {
    Assignment a;
    a.refused = refused;
    a.group_rank = g;
    a.offset = offset;
    a.world = world;
    a.rc = rc;
    a.streak = streak;
    if (refused.empty()) {
      const int next = (g + 1) % closed;
      a.next = lineup.arrivals[next];
      a.next_host = p.nodes[next].host;
      a.next_link = p.nodes[next].state.link;
      a.holders = holders;
      offset += p.nodes[g].nproc;
    }
    keys.push_back(round_key(round, Name::assign, refused.empty() ? lineup.arrivals[g] : g));
    values.push_back(assignment_json(a));
  }
  if (!stand_in) {
    c.put_many(keys, values);
  } else {
    for (std::size_t k = 0; k < keys.size(); ++k) values[k] = c.create(keys[k], values[k]);
  }
  for (std::size_t k = 0; k < keys.size(); ++k) {
    if (keys[k].name == Name::assign && keys[k].index == idx) p.mine = values[k];
  }
  return p;
}

// This node's assignment in round `round` (its idx-th arrival): as the round's last member wrote
// it, or, when that has not come within read_timeout, as this node writes it (with the records
// assign read). The one read of the round a member makes: its own assignment, O(1) bytes.
RoundRules::Placed RoundRules::own_assignment(int round, int idx, int closed) {
  auto& c = *conn_;
  const Key ak = round_key(round, Name::assign, idx);
  if (idx == closed - 1) return assign(round, idx, closed, false);
  Placed p;
  if (c.wait({ak}, time_.now() + opt_.read_timeout)) {
    if (auto v = c.get_many({ak}).front()) {
      p.mine = *v;
      return p;
    }
  }
  // No assignment: the last member died, or a record never came. A member that gave the
  // round up, or a stop, says so on the store key; otherwise this node assigns.
  const Key sk = round_key(round, Name::store);
  if (auto v = c.get(sk)) {
    const StoreAddress s = parse_store(c.name(sk), *v);
    if (s.stopped) throw_stopped(c, round);
    if (s.gone >= 0) {
      p.gone = MemberGone{s.gone, "?", "was given up by another member before the round ran"};
      return p;
    }
  }
  return assign(round, idx, closed, true);
}

}  // namespace ddprun::rounds
