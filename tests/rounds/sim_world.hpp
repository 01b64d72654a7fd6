#pragma once
// The deterministic simulator of the round rules (issue 32): N nodes run RoundRules over an
// in-memory backend in one thread, on virtual time. Every backend call of a node parks its fiber;
// a seeded scheduler picks, step by step, which call is delivered (and when virtual time moves
// on), and whether a fault happens instead: a delay, a failed call, a crash (the node loses its
// memory and restarts later, with the same or a new node id), a keep-alive that stops getting
// through, a pause past the fence, a stale write replayed, a relaunch of the whole job with the
// same run id, a worker group that fails or succeeds. Invariants are checked after every step;
// after the faults stop, liveness is checked within a bound.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend.hpp"
#include "ddprun/rounds/options.hpp"
#include "memory_keys.hpp"
#include "sim_fiber.hpp"

namespace ddprun::rounds::sim {

using Time = Clock::time_point;
using ms = std::chrono::milliseconds;
// Liveness: once the faults stop, every node settles within this much virtual time.
inline constexpr auto kQuietBound = std::chrono::seconds(60);

// Thrown into a fiber whose node crashed: unwinds it (not a std::exception: nothing catches it
// but the fiber's body).
struct Crash {};

// The backend modelled: an external c10d store (keys kept until the store goes, liveness by the
// keep-alive ring) or etcd (clear_run deletes the run's keys, markers expire, node keys go with
// the node's lease).
enum class Flavor { store, etcd };

struct Settings {
  std::uint64_t seed = 0;
  Flavor flavor = Flavor::store;
  BackendKind kind = BackendKind::c10d;
  int nodes = 3, min_nodes = 1, max_nodes = 3;
  int fault_steps = 300;  // steps with faults; then quiet time
  int max_restarts = -1;  // a failed round with no restart left ends the job on every node; -1: never
  int max_same_failures = 0;  // --max_same_failures: the same root cause this many rounds in a row ends the job; 0: off
  // Half the seeds: while faults last, a keep-alive request (a renewal or a read of the next
  // member's counter) is now and then held up to 2 TTLs on its way to the backend. Drawn from a
  // stream of its own, so that the other seeds' schedules (and the seeds found before) stay.
  bool ring_delays = false;
  bool liveness = true;   // check liveness in quiet time (else stop after the faults)
  RendezvousOptions opt;
  std::string describe() const;
};
Settings settings_of(std::uint64_t seed);

struct Event {
  enum class Kind { workers_failed, workers_succeeded, peer_lost } kind;
  int round = 0, g = 0;
  int cause = 0;  // workers_failed: the root cause, an exit code (> 0) or a signal (< 0)
};

// One incarnation of a node: what it knows dies with it.
struct Node {
  int slot = 0, launch = 0, incarnation = 0;
  std::string id;
  bool alive = true, paused = false;
  enum class State { starting, joining, running, done, failed, crashed } state = State::starting;
  std::string why;  // failed: the message
  int epoch = 0, round = -1, group_rank = -1, group_world = 0;
  bool workers = false, succeeded = false;
  Time started{};
  std::optional<Time> first_look;  // when its first read of the run's `finished` marker was answered
  Time fence_until{};
  Time lease_until{};      // etcd: its node keys go after then
  Time paused_until{};
  Time ring_slow_until{};  // its keep-alive requests do not get through before then
  std::deque<Event> events;
  int watching = -1;  // the round its liveness watch runs for
  // r<R>/members as it stood when this node read or wrote round R's assignments (sim_node.cpp):
  // what a member that read the lineup with its assignment would have read.
  std::map<int, std::string> lineups;
};

// A fiber of a node, parked on one backend call.
struct Task {
  Node* node = nullptr;
  std::unique_ptr<Fiber> fiber;
  bool ring = false;
  enum class Park { none, call, wait, sleep } park = Park::none;
  std::vector<Key> keys;
  std::vector<std::string> texts;  // the keys' texts
  Time deadline{};
  bool interruptible = false;  // a wait that a node event ends early
  bool crash = false, fail = false;
  Time not_before{};  // a delayed call is not delivered before then
};

// The world's virtual time is its nodes' time (the rules' TimeSource, backend.hpp).
class World : public TimeSource {
 public:
  explicit World(const Settings& s, bool trace);
  ~World();
  // Runs the schedule; returns the first violation ("" when none).
  std::string run();
  const std::vector<std::string>& trace() const { return trace_; }
  std::uint64_t steps() const { return steps_; }

  // For the nodes' fibers (sim_node.cpp).
  Time now() const override { return now_; }
  std::chrono::system_clock::time_point wall() const override {
    return std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(now_.time_since_epoch()));
  }
  const Settings& settings() const { return s_; }
  void call(const char* what, const Key* k = nullptr);  // parks the running fiber on a call
  bool wait(const std::vector<Key>& keys, Time deadline, bool interruptible);
  void sleep_until(Time t);
  std::optional<std::string> get(const std::string& k);
  void put(const std::string& k, const std::string& v, Lifetime life, Node& n);
  std::string create(const std::string& k, const std::string& v, Lifetime life, Node& n);
  std::int64_t add(const std::string& k, std::int64_t d);
  void clear_run();
  void spawn_ring(Node& n, const Members& m);
  void renewed(Node& n, Time sent);
  void joined(Node& n, const RoundInfo& info, const std::vector<std::string>& hosts);
  void check_kept_place(const Node& n, const RoundInfo& info, const std::vector<std::string>& hosts);
  void ended(Node& n, int round, const std::string& end_json);
  void finished(Node& n);
  // Member `n` decided, on round `round`'s end, to restart, or that the job ends (a crash loop, no restart left).
  void decided(Node& n, int round, const std::string& verdict);
  void violate(const std::string& what);
  Task* current() const { return current_; }
  std::mt19937_64 rng;
  std::mt19937_64 ring_rng;  // the keep-alive delays' own stream (Settings::ring_delays)

 private:
  struct Written {  // what the world keeps beside a key's value
    Lifetime life = Lifetime::run;
    Node* owner = nullptr;
    Time expires{};  // markers (etcd)
  };
  using Keys = testing::MemoryKeys<Written>;
  struct RoundSeen {
    std::vector<std::string> hosts;  // by group rank
    std::set<std::string> succeeded;
    std::string end_writer;  // the node whose end of the round stood
    std::set<std::string> tried_end;  // nodes that tried to end it (a member it gave up on as lost)
    bool decisive = false;  // it ended "failure" or "success": each member decides on it
    bool reports_first = false;  // every member reported success before any membership request
    int restart_count = -1;
    std::string verdict, verdict_by;  // what the first member to decide on its end decided, and who
  };
  Node& start_node(int slot, int launch, const std::string& id);
  void spawn(Node& n, std::function<void()> body, bool ring);
  bool step(bool faults);
  bool ready(const Task& t) const;
  void resume(Task& t);
  void fault();
  void crash(Node& n);
  void relaunch();
  void expire_leases();
  void fence();
  void restarts();
  void outcome();
  void replay();
  void check_put(const std::string& k, const std::string& v);
  bool settled();
  bool settled_after_finish();
  bool refused_relaunch(const Node& n);
  std::optional<Time> next_time() const;
  std::string check_quiet_liveness();
  void note(const std::string& s);
  std::string fresh_id();
  int pick(int n) { return static_cast<int>(rng() % static_cast<std::uint64_t>(n)); }
  int cause();  // a failed group's root cause: one of a few, from a stream of its own
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

  Settings s_;
  bool tracing_;
  Time now_;
  Keys kv_;
  std::deque<std::pair<std::string, Keys::Entry>> puts_;  // recent puts, for stale replays
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<std::unique_ptr<Task>> tasks_;
  Task* current_ = nullptr;
  int launch_ = 0, epoch_ = 0, relaunches_ = 0, ids_ = 0;
  std::map<int, bool> launch_finished_;
  std::map<int, int> finished_round_;  // by launch: the round its job ended with
  std::map<int, Time> finished_at_;
  std::map<int, Time> marked_at_;  // by launch: the earliest time its `finished` markers hold
  std::map<int, Time> last_marked_;  // by launch: the latest time its `finished` markers hold
  void marked(int launch, long long at_ms);
  struct Restart {
    int slot, launch;
    std::string id;
    Time at;
  };
  std::vector<Restart> restarts_;
  std::vector<Node*> current_nodes_;  // the current incarnation of each slot
  std::map<std::pair<int, int>, RoundSeen> rounds_;  // by (epoch, round)
  std::map<std::string, std::pair<int, int>> last_round_;  // node id: (epoch, round) last joined
  // node id: (round, group rank) it last ran with, and the one before (kept places, invariant 11)
  std::map<std::string, std::pair<int, int>> place_, place_before_;
  std::pair<int, long long> latest_{0, -1};  // (epoch, the `round` key's highest value)
  std::vector<std::string> trace_;
  std::string violation_;
  std::uint64_t steps_ = 0;
  Time expired_at_{};  // the last expire_leases
  std::mt19937_64 causes_;  // apart from `rng`: drawing causes leaves the schedule's draws as they were
  bool faulting_ = false;  // the step runs with faults
};

// The body of a node's main fiber (sim_node.cpp).
void node_main(World& w, Node& n);

// Runs seed `seed`; "" or the violation, with the schedule when `trace`.
struct Outcome {
  std::string violation;
  std::vector<std::string> trace;
  std::uint64_t steps = 0;
};
Outcome run_seed(std::uint64_t seed, bool trace = false, bool liveness = true);

}  // namespace ddprun::rounds::sim
