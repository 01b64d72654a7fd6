// A node of the simulator: RoundRules over a backend whose every call is a step of the world,
// and the agent around them (join, run the workers, end or report the round, join the next).
#include <csignal>
#include <cstdlib>

#include "keep_alive_ring.hpp"
#include "rendezvous_error.hpp"
#include "round_rules.hpp"
#include "round_state.hpp"
#include "sim_world.hpp"
#include "workers_store.hpp"

namespace ddprun::rounds::sim {
namespace {

class SimConnection : public Connection {
 public:
  SimConnection(World& w, Node& n) : w_(w), n_(n) {}
  std::optional<std::string> get(const Key& k) override {
    w_.call("get", &k);
    return w_.get(k.text());
  }
  // One request, applied at once, as a store's MULTI_GET and MULTI_SET.
  std::vector<std::optional<std::string>> get_many(const std::vector<Key>& keys) override {
    w_.call("get_many", keys.empty() ? nullptr : &keys[0]);
    std::vector<std::optional<std::string>> out;
    for (const auto& k : keys) out.push_back(w_.get(k.text()));
    if (!keys.empty()) saw(keys[0]);
    return out;
  }
  void put(const Key& k, const std::string& v, Lifetime life) override {
    w_.call("put", &k);
    w_.put(k.text(), v, life, n_);
  }
  void put_many(const std::vector<Key>& keys, const std::vector<std::string>& values, Lifetime life) override {
    w_.call("put_many", keys.empty() ? nullptr : &keys[0]);
    for (std::size_t i = 0; i < keys.size(); ++i) w_.put(keys[i].text(), values[i], life, n_);
    if (!keys.empty()) saw(keys[0]);
  }
  std::string create(const Key& k, const std::string& v, Lifetime life) override {
    w_.call("create", &k);
    std::string stands = w_.create(k.text(), v, life, n_);
    saw(k);
    return stands;
  }
  std::int64_t add(const Key& k, std::int64_t d) override {
    w_.call("add", &k);
    return w_.add(k.text(), d);
  }
  bool wait(const std::vector<Key>& keys, Clock::time_point deadline) override {
    return w_.wait(keys, deadline, interruptible_);
  }
  void clear_run() override {
    w_.call("clear_run");
    w_.clear_run();
  }
  std::string name(const Key& k) const override { return "sim/" + k.text(); }
  bool interruptible_ = false;

 private:
  // A read or write of round R's assignments or lineup: the lineup as it stands, in the same
  // step (the invariants compare it across members; the member itself reads only its own place).
  void saw(const Key& k) {
    if (k.name != Name::assign && k.name != Name::members) return;
    if (auto v = w_.get(round_key(k.round, Name::members).text())) n_.lineups[k.round] = *v;
  }

  World& w_;
  Node& n_;
};

class SimLiveness : public Liveness {
 public:
  explicit SimLiveness(Node& n) : n_(n) {}
  ~SimLiveness() override { n_.watching = -1; }

 private:
  Node& n_;
};

class SimBackend : public Backend {
 public:
  SimBackend(World& w, Node& n) : w_(w), n_(n) {}
  std::string where() const override { return "the simulated backend"; }
  std::unique_ptr<Connection> connect(std::chrono::milliseconds) override {
    w_.call("connect");
    return std::make_unique<SimConnection>(w_, n_);
  }
  std::string reach() const override { return "10.0.0.1"; }
  bool holds_records() const override { return false; }
  std::chrono::milliseconds liveness_ttl() const override {
    const auto& o = w_.settings().opt;
    return w_.settings().flavor == Flavor::store ? o.keep_alive_interval * o.keep_alive_max_attempt
                                                 : std::chrono::milliseconds(o.lease_ttl);
  }
  std::unique_ptr<Liveness> watch(const Members& m, std::weak_ptr<LivenessEvents>) override {
    n_.watching = m.round;
    if (w_.settings().flavor == Flavor::store) {
      // The first keep-alive before the round's workers start, as StoreBackend::watch does.
      SimConnection c(w_, n_);
      KeepAliveRing ring(m, w_.settings().opt.keep_alive_interval, liveness_ttl(), w_);
      ring.beat(c, [&](Clock::time_point sent) { w_.renewed(n_, sent); });
    }
    w_.spawn_ring(n_, m);
    return std::make_unique<SimLiveness>(n_);
  }
  bool members_silent(Connection& c, int round, int members, std::vector<long long>& seen) override {
    return w_.settings().flavor == Flavor::store ? counters_silent(c, round, members, seen) : records_gone(c, round, members);
  }

 private:
  World& w_;
  Node& n_;
};

class SimWorkers : public WorkersStore {
 public:
  explicit SimWorkers(int slot) : WorkersStore("", 0), slot_(slot) {}
  StoreAddress host(const RoundInfo&) override {
    StoreAddress a;
    a.host = "10.0.0." + std::to_string(slot_ + 1);
    a.port = static_cast<std::uint16_t>(1000 + slot_);
    return a;
  }
  void release() override {}

 private:
  int slot_;
};

// What a node offers of the workers' state as it joins (a function of its id alone, so that the
// offers of a round's members can be told from its lineup).
StateOffer offer_of(const std::string& id) { return StateOffer{id + ":link", !id.empty() && id.back() % 2 == 1}; }

// The round's lineup as the store held it when this member read (or wrote) its assignment (taken
// beside the protocol: a member reads only its own place): its hosts by group rank, for the
// invariants over memberships. The member's ring neighbour (its assignment's `next`) must be the
// lineup's next group rank, its buddy's state link the next member's, and the round's holders of
// state those of the lineup.
std::vector<std::string> lineup_of(World& w, const Node& n, const RoundRules::Joined& j) {
  const Key mk = round_key(j.info.round, Name::members);
  const auto v = n.lineups.find(j.info.round);
  if (v == n.lineups.end()) {
    w.violate("round " + std::to_string(j.info.round) + ": " + n.id + " joined it, but no lineup stood beside its assignment");
    return {};
  }
  const Lineup l = parse_lineup(mk.text(), v->second, j.info.group_world);
  const Members& m = j.members;
  const int next = (j.info.group_rank + 1) % j.info.group_world;
  if (m.round != j.info.round || m.group_rank != j.info.group_rank || m.group_world != j.info.group_world ||
      m.next() != next || m.next_record.index != l.arrivals[next] || m.next_host != l.hosts[next]) {
    w.violate("round " + std::to_string(j.info.round) + ": " + n.id + " (group rank " + std::to_string(j.info.group_rank) +
              ") watches arrival " + std::to_string(m.next_record.index) + " (" + m.next_host + "), the lineup's next is " +
              std::to_string(l.arrivals[next]) + " (" + l.hosts[next] + ")");
  }
  int holders = 0;
  for (const auto& h : l.hosts) holders += offer_of(h).holds ? 1 : 0;
  if (j.info.next_state_link != offer_of(l.hosts[next]).link || j.info.state_holders != holders ||
      j.info.holds_state != offer_of(n.id).holds) {
    w.violate("round " + std::to_string(j.info.round) + ": " + n.id + " was told buddy link '" + j.info.next_state_link +
              "' and " + std::to_string(j.info.state_holders) + " holders of state; the lineup's next offers '" +
              offer_of(l.hosts[next]).link + "', and " + std::to_string(holders) + " of its members hold state");
  }
  return l.hosts;
}

RendezvousOptions options_of(const World& w, const Node& n) {
  RendezvousOptions o = w.settings().opt;
  o.node_rank = n.slot;
  return o;
}

// Runs the round until it ends: the workers' outcomes and lost peers are told to the rules.
RoundEnd run_round(World& w, Node& n, RoundRules& rules, SimConnection& watch, const RoundRules::Joined& j) {
  const int round = j.info.round, world = j.info.group_world;
  for (;;) {
    while (!n.events.empty()) {
      Event e = n.events.front();
      n.events.pop_front();
      if (e.round != round) continue;
      if (e.kind == Event::Kind::peer_lost) {
        rules.end_round(round, RoundEnd::of_node_lost(e.g, e.g == j.members.next() ? j.members.next_host : "?", 1.0), world - 1);
      } else if (e.kind == Event::Kind::workers_failed) {
        FailureRecord f;
        f.host = n.id;
        (e.cause < 0 ? f.status.signal : f.status.code) = e.cause < 0 ? -e.cause : e.cause;
        f.reason = (e.cause < 0 ? "signal " : "exit code ") + std::to_string(std::abs(e.cause));
        rules.end_round(round, RoundEnd::of_failure(f), world);
      } else {
        rules.report_success(round, world);
      }
    }
    if (auto e = rules.end_by(watch, round, w.now() + w.settings().opt.keep_alive_interval * w.settings().opt.keep_alive_max_attempt)) return *e;
  }
}

void play(World& w, Node& n) {
  const RendezvousOptions opt = options_of(w, n);
  SimBackend backend(w, n);
  SimWorkers workers(n.slot);
  Self self;
  self.node_id = n.id;
  self.info.host = n.id;
  self.info.reach = "10.0.0.1";
  self.info.nproc = 1;
  self.info.node_rank = n.slot;
  RoundRules rules(opt, backend, workers, self, w);
  rules.connect();
  int round = 0, rc = -1;
  Streak streak;  // the crash-loop streak this node brings to the next round
  for (;;) {
    n.state = Node::State::joining;
    auto j = rules.join(round, rc, streak, offer_of(n.id));
    streak = j.info.streak;
    w.joined(n, j.info, lineup_of(w, n, j));
    RoundEnd end;
    {
      auto live = backend.watch(j.members, {});
      auto c = backend.connect(opt.read_timeout);
      auto& watch = static_cast<SimConnection&>(*c);
      watch.interruptible_ = true;
      n.state = Node::State::running;
      n.workers = w.now() < n.fence_until;  // the fence was armed by the first keep-alive
      n.succeeded = false;
      if (!n.workers) n.events.push_back({Event::Kind::workers_failed, j.info.round, 0, -9});
      end = run_round(w, n, rules, watch, j);
      n.workers = false;
    }
    w.ended(n, j.info.round, round_end_json(end));
    const int rcount = j.info.restart_count;
    if (end.kind == RoundEnd::Kind::success) {
      rules.acknowledge_end(j.info.round, j.info.group_world);
      n.state = Node::State::done;
      w.finished(n);
      return;
    }
    if (end.kind == RoundEnd::Kind::failure) {
      // ddprun's restart policy: a crash loop, or no restart left, ends the job here, on every
      // node that saw this end; else the job restarts.
      const auto after = after_failure(j.info.streak, *end.failure, rcount, w.settings().max_restarts,
                                       w.settings().max_same_failures);
      streak = after.streak;
      using V = AfterFailure::Verdict;
      const char* verdict = after.verdict == V::crash_loop        ? "crash loop"
                            : after.verdict == V::no_restart_left ? "no restart left"
                                                                  : "restart";
      w.decided(n, j.info.round, verdict);
      if (after.verdict != V::restart) {
        rules.acknowledge_end(j.info.round, j.info.group_world);
        n.state = Node::State::done;
        w.finished(n);
        return;
      }
    }
    rc = rcount + (end.kind == RoundEnd::Kind::failure ? 1 : 0);
    round = j.info.round + 1;
  }
}

}  // namespace

void node_main(World& w, Node& n) {
  try {
    play(w, n);
  } catch (const Crash&) {
    n.state = Node::State::crashed;
  } catch (const RendezvousError& e) {
    n.state = Node::State::failed;
    n.why = std::string(to_string(e.failure.kind)) + ": " + e.what();
  } catch (const std::exception& e) {
    n.state = Node::State::failed;
    n.why = e.what();
  }
  n.workers = false;
  n.watching = -1;
  n.alive = n.state == Node::State::done;
}

// The node's liveness watch of round `m.round`: its keep-alive ring (store) or its lease's
// keeper and a watch of the next member's record (etcd).
void ring_main(World& w, Node& n, const Members& m) {
  try {
    SimConnection c(w, n);
    const auto& o = w.settings().opt;
    auto renewed = [&](Clock::time_point sent) { w.renewed(n, sent); };
    if (w.settings().flavor == Flavor::store) {
      KeepAliveRing ring(m, o.keep_alive_interval, o.keep_alive_interval * o.keep_alive_max_attempt, w);
      while (n.watching == m.round) {
        w.sleep_until(w.now() + ring.every());
        if (n.watching != m.round) break;
        if (auto idle = ring.check(c, renewed)) n.events.push_back({Event::Kind::peer_lost, m.round, ring.next()});
      }
    } else {
      const auto every = std::chrono::milliseconds(o.lease_ttl) / 3;
      while (n.watching == m.round) {
        w.sleep_until(w.now() + every);
        if (n.watching != m.round) break;
        const Time sent = w.now();
        w.call("keep_alive");
        w.renewed(n, sent);
        // The next member's record, as EtcdBackend's watch (a round of one watches none).
        const int g = m.next();
        if (g != m.group_rank && !c.get(m.next_record)) {
          n.events.push_back({Event::Kind::peer_lost, m.round, g});
          while (n.watching == m.round) w.sleep_until(w.now() + every);
          return;
        }
      }
    }
  } catch (const Crash&) {
  } catch (const std::exception&) {
    // The watch lost the backend: the round is over here (the agent stops its workers).
    if (n.watching == m.round) n.events.push_back({Event::Kind::workers_failed, m.round, 0, -15});
  }
}

}  // namespace ddprun::rounds::sim
