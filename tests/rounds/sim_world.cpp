// The simulator's world: virtual time, the backend's keys, the scheduler and its faults, the
// invariants (sim_world.hpp).
#include "sim_world.hpp"

#include <algorithm>
#include <exception>
#include <sstream>

#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/rounds/records.hpp"
#include "round_state.hpp"

namespace ddprun::rounds::sim {
namespace {

using namespace std::chrono_literals;

constexpr auto kMarkerTtl = std::chrono::seconds(600);  // etcd's markers (etcd_backend.cpp)

std::string secs(Time t) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", std::chrono::duration<double>(t.time_since_epoch()).count());
  return b;
}

}  // namespace

void ring_main(World& w, Node& n, const Members& m);

std::string Settings::describe() const {
  std::ostringstream o;
  o << "seed " << seed << ": " << (flavor == Flavor::store ? "store" : "etcd") << ", " << to_string(kind) << ", "
    << nodes << " nodes, --nnodes=" << min_nodes << ":" << max_nodes << ", --max_restarts="
    << (max_restarts < 0 ? std::string("unlimited") : std::to_string(max_restarts))
    << ", --max_same_failures=" << max_same_failures << ", " << fault_steps
    << " steps of faults" << (ring_delays ? ", keep-alive delays" : "");
  return o.str();
}

Settings settings_of(std::uint64_t seed) {
  std::mt19937_64 r(seed);
  Settings s;
  s.seed = seed;
  s.flavor = r() % 2 ? Flavor::etcd : Flavor::store;
  s.kind = r() % 4 == 0 ? BackendKind::static_ranks : BackendKind::c10d;
  s.nodes = 2 + static_cast<int>(r() % 5);
  s.max_nodes = s.nodes;
  s.min_nodes = s.kind == BackendKind::static_ranks ? s.nodes : 1 + static_cast<int>(r() % s.nodes);
  s.fault_steps = 40 + static_cast<int>(r() % 120);
  auto& o = s.opt;
  o.backend = s.kind;
  o.run_id = "job";
  o.min_nodes = s.min_nodes;
  o.max_nodes = s.max_nodes;
  o.join_timeout = 30s;
  o.last_call_timeout = 1s;
  o.read_timeout = 3s;
  o.close_timeout = 5s;  // later than any restart of a node of the job (3.2 s): a later start is a relaunch
  o.keep_alive_interval = 2s;
  o.keep_alive_max_attempt = 2;
  o.lease_ttl = std::chrono::seconds(4);
  // Drawn last, so that the draws above (and the seeds found before it) stay as they were.
  const int restarts = static_cast<int>(r() % 5);
  s.max_restarts = restarts == 4 ? -1 : restarts;
  // After that, likewise: --max_same_failures off in half the seeds, else 2 or 3.
  const int same = static_cast<int>(r() % 4);
  s.max_same_failures = same < 2 ? 0 : same;
  s.ring_delays = !std::getenv("DDPRUN_SIM_NO_RING_DELAYS") && std::mt19937_64(seed ^ 0x5bd1e995ULL)() % 2 == 0;
  return s;
}

World::World(const Settings& s, bool trace)
    : rng(s.seed * 0x9e3779b97f4a7c15ULL + 1), ring_rng(s.seed * 0xc2b2ae3d27d4eb4fULL + 7), s_(s), tracing_(trace),
      causes_(s.seed ^ 0x2545f4914f6cdd1dULL) {
  now_ = Time(std::chrono::hours(1));
  for (int i = 0; i < s_.nodes; ++i) current_nodes_.push_back(&start_node(i, 0, fresh_id()));
}

World::~World() {
  // Every fiber not done crashes, so that none is destroyed parked (sim_fiber.hpp): a parked one
  // throws Crash from its call; one that never ran starts, parks at its first call, then crashes.
  // (Where run() threw, the fibers are left to Boost.Context's unwinding: no switch may happen
  // while an exception is in flight.)
  if (std::uncaught_exceptions() > 0) return;
  for (auto& t : tasks_) {
    for (int tries = 0; tries < 3 && !t->fiber->done(); ++tries) {
      t->crash = true;
      resume(*t);
    }
  }
}

std::string World::fresh_id() { return "n" + std::to_string(++ids_); }

void World::note(const std::string& s) {
  if (tracing_) trace_.push_back("t=" + secs(now_) + " " + s);
}

void World::violate(const std::string& what) {
  if (violation_.empty()) violation_ = "at t=" + secs(now_) + ", step " + std::to_string(steps_) + ": " + what;
}

Node& World::start_node(int slot, int launch, const std::string& id) {
  auto n = std::make_unique<Node>();
  n->slot = slot;
  n->launch = launch;
  n->id = id;
  // A node started (again) has run no round yet: its record names no place (invariant 11).
  place_.erase(id);
  place_before_.erase(id);
  n->lease_until = now_ + s_.opt.lease_ttl;
  n->started = now_;
  Node& ref = *n;
  nodes_.push_back(std::move(n));
  note("start " + id + " (slot " + std::to_string(slot) + ", launch " + std::to_string(launch) + ")");
  spawn(ref, [this, &ref] { node_main(*this, ref); }, false);
  return ref;
}

void World::spawn(Node& n, std::function<void()> body, bool ring) {
  auto t = std::make_unique<Task>();
  t->node = &n;
  t->ring = ring;
  t->fiber = std::make_unique<Fiber>(std::move(body));
  t->park = Task::Park::sleep;  // runs at its first step
  t->deadline = now_;
  tasks_.push_back(std::move(t));
}

void World::spawn_ring(Node& n, const Members& m) {
  spawn(n, [this, &n, m] { ring_main(*this, n, m); }, true);
}

void World::call(const char* what, const Key* k) {
  Task* t = current_;
  t->park = Task::Park::call;
  if (tracing_) note(t->node->id + (t->ring ? "/watch " : " ") + what + (k ? " " + k->text() : ""));
  if (t->ring && faulting_ && s_.ring_delays && ring_rng() % 8 == 0) {
    // A keep-alive request held on its way: it reaches the backend (and reads it) that late.
    const auto ttl = s_.opt.keep_alive_interval * s_.opt.keep_alive_max_attempt;
    t->not_before = now_ + ms(ring_rng() % static_cast<std::uint64_t>(2 * ttl.count()));
    note("delay a call of " + t->node->id + "/watch by " + std::to_string((t->not_before - now_) / 1ms) + "ms");
  }
  Fiber::yield();
  if (t->crash) throw Crash{};
  if (t->fail) {
    t->fail = false;
    throw NetworkError(std::string("simulated: the connection failed during ") + what);
  }
}

bool World::wait(const std::vector<Key>& keys, Time deadline, bool interruptible) {
  Task* t = current_;
  t->park = Task::Park::wait;
  t->keys = keys;
  t->texts.clear();
  for (const auto& k : keys) t->texts.push_back(k.text());
  t->deadline = deadline;
  t->interruptible = interruptible;
  Fiber::yield();
  if (t->crash) throw Crash{};
  if (t->fail) {
    t->fail = false;
    throw NetworkError("simulated: the connection failed during wait");
  }
  for (const auto& k : t->texts) {
    if (!kv_.has(k)) return false;
  }
  return true;
}

void World::sleep_until(Time when) {
  Task* t = current_;
  t->park = Task::Park::sleep;
  t->deadline = when;
  Fiber::yield();
  if (t->crash) throw Crash{};
}

std::optional<std::string> World::get(const std::string& k) {
  if (k == "finished" && current_ && !current_->node->first_look) current_->node->first_look = now_;
  return kv_.get(k);
}

void World::put(const std::string& k, const std::string& v, Lifetime life, Node& n) {
  check_put(k, v);
  if (k == "finished") marked(n.launch, parse_finished(k, v, 0).at_ms);
  puts_.push_back({k, kv_.put(k, {v, {life, &n, now_ + kMarkerTtl}})});
  if (puts_.size() > 24) puts_.pop_front();
}

// A job ended at the time its first marker says (what every node reads, however late the write
// landed: a node that reads a marker older than close_timeout is a relaunch, nothing tells it
// apart from one).
void World::marked(int launch, long long at_ms) {
  const Time at{std::chrono::milliseconds(at_ms)};
  auto [it, first] = marked_at_.try_emplace(launch, at);
  if (!first) it->second = std::min(it->second, at);
  auto [last, none] = last_marked_.try_emplace(launch, at);
  if (!none) last->second = std::max(last->second, at);
  if (launch_finished_[launch]) finished_at_[launch] = std::min(finished_at_[launch], at);
}

std::string World::create(const std::string& k, const std::string& v, Lifetime life, Node& n) {
  auto [stands, fresh] = kv_.create(k, {v, {life, &n, now_ + kMarkerTtl}});
  if (k.size() > 4 && k.compare(k.size() - 4, 4, "/end") == 0) rounds_[{epoch_, std::stoi(k.substr(1))}].tried_end.insert(n.id);
  if (fresh && k.size() > 4 && k.compare(k.size() - 4, 4, "/end") == 0) {
    // A round ended "node lost": the lost member's workers must be gone by now (its fence).
    RoundEnd e = parse_round_end(k, v);
    int round = std::stoi(k.substr(1));
    rounds_[{epoch_, round}].end_writer = n.id;
    rounds_[{epoch_, round}].decisive = e.kind == RoundEnd::Kind::failure || e.kind == RoundEnd::Kind::success;
    auto r = rounds_.find({epoch_, round});
    if (e.kind == RoundEnd::Kind::membership && r != rounds_.end() && !r->second.hosts.empty()) {
      // A late node's request must not beat a success every member had reported first.
      if (r->second.reports_first) {
        violate("round " + std::to_string(round) + " ended 'membership' after every member had reported success");
      }
    }
    if (e.kind == RoundEnd::Kind::node_lost && r != rounds_.end() && e.group_rank >= 0 &&
        e.group_rank < static_cast<int>(r->second.hosts.size())) {
      for (auto& nd : nodes_) {
        if (nd->id == r->second.hosts[e.group_rank] && nd->workers && nd->round == round && nd->epoch == epoch_) {
          violate("round " + std::to_string(round) + " ended 'node " + nd->id + " lost' while its workers still run " +
                  "(fence until " + secs(nd->fence_until) + ")");
        }
      }
    }
  }
  return stands.value;
}

std::int64_t World::add(const std::string& k, std::int64_t d) {
  const std::int64_t n = kv_.add(k, d);
  if (d == 1 && k.size() > 10 && k.compare(k.size() - 10, 10, "/succeeded") == 0) {
    // Every member reported success before any membership request was counted (n stays >= 0).
    RoundSeen& r = rounds_[{epoch_, std::stoi(k.substr(1))}];
    if (!r.hosts.empty() && n == static_cast<std::int64_t>(r.hosts.size())) r.reports_first = true;
  }
  return n;
}

void World::clear_run() {
  note("clear_run");
  if (s_.flavor != Flavor::etcd) return;  // a store keeps the keys: the rounds go on counting
  kv_.clear_run();
  ++epoch_;
}

// The job's latest round never goes back (a node new to the job would meet in an old one).
void World::check_put(const std::string& k, const std::string& v) {
  if (k != "round") return;
  long long r = parse_int(v).value_or(-1);
  if (latest_.first == epoch_ && r < latest_.second) {
    violate("the job's latest round went back from " + std::to_string(latest_.second) + " to " + v);
  }
  if (latest_.first != epoch_ || r > latest_.second) latest_ = {epoch_, r};
}

int World::cause() { return 1 + static_cast<int>(causes_() % 2); }

// Every member of a round that decides on its end decides alike: a node that restarts while
// another ends the job as a crash loop would find the job finished in the next round (exit 1).
void World::decided(Node& n, int round, const std::string& verdict) {
  note(n.id + " decided on round " + std::to_string(round) + ": " + verdict);
  RoundSeen& r = rounds_[{n.epoch, round}];
  if (r.verdict.empty()) {
    r.verdict = verdict;
    r.verdict_by = n.id;
  } else if (r.verdict != verdict) {
    violate("round " + std::to_string(round) + ": " + r.verdict_by + " decided '" + r.verdict + "', " + n.id +
            " decided '" + verdict + "' (the members disagree on how the job goes on)");
  }
}

void World::renewed(Node& n, Time sent) {
  const auto ttl = s_.flavor == Flavor::store ? s_.opt.keep_alive_interval * s_.opt.keep_alive_max_attempt
                                              : std::chrono::milliseconds(s_.opt.lease_ttl);
  n.fence_until = std::max(n.fence_until, sent + ttl - std::min<ms>(ttl / 4, 2s));
}

}  // namespace ddprun::rounds::sim
