#pragma once
// The seam under the round rules: the few primitives a c10d store and etcd both have. The round
// rules (round_rules.hpp) are written once over it; StoreBackend and EtcdBackend implement it,
// and tests implement it in memory.
//
// A Connection is used by one thread at a time; every call is bounded (the backend's read
// time-out) and throws ddprun::Error (NetworkError, TimeoutError, AuthError) when the backend
// cannot answer. Values are never deleted while a run lasts, so "exists" never turns back.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/rounds/rendezvous.hpp"
#include "bounded_thread.hpp"
#include "keys.hpp"

namespace ddprun::rounds {

// The backends' clock: the steady clock; wall() for what crosses nodes (markers).
struct Clock : std::chrono::steady_clock {
  static std::chrono::system_clock::time_point wall() { return std::chrono::system_clock::now(); }
};

// The round rules' time, injected as LevelDB's Env is: TimeSource::real() (Clock), or a simulator's
// virtual time (tests/rounds/sim_world.hpp). Its time points are the steady clock's, so
// deadlines cross to the Fence unchanged.
class TimeSource {
 public:
  virtual ~TimeSource() = default;
  virtual Clock::time_point now() const = 0;
  virtual std::chrono::system_clock::time_point wall() const = 0;
  static const TimeSource& real() {
    struct Real final : TimeSource {
      Clock::time_point now() const override { return Clock::now(); }
      std::chrono::system_clock::time_point wall() const override { return Clock::wall(); }
    };
    static const Real r;
    return r;
  }
};

// How long a key lives.
enum class Lifetime {
  run,     // until the run's keys are cleared
  node,    // until this node is lost (etcd: on its lease); a store keeps it for the run
  marker,  // outlives the run's other keys for a while (etcd: ten minutes), to tell late nodes
};

class Connection {
 public:
  virtual ~Connection() = default;
  virtual std::optional<std::string> get(const Key& k) = 0;
  virtual void put(const Key& k, const std::string& value, Lifetime life = Lifetime::run) = 0;
  // First writer wins: stores `value` unless `k` exists. Returns the value that stands.
  virtual std::string create(const Key& k, const std::string& value, Lifetime life = Lifetime::run) = 0;
  // Adds `delta` to the counter at `k` (missing counts as 0); returns the new value.
  virtual std::int64_t add(const Key& k, std::int64_t delta) = 0;
  // Waits until every key of `keys` exists; false when `deadline` passes first.
  virtual bool wait(const std::vector<Key>& keys, Clock::time_point deadline) = 0;
  // The values of `keys`, in their order (none: missing), read at once where the backend can
  // (a store: one MULTI_GET; etcd: one range read of keys of one family).
  virtual std::vector<std::optional<std::string>> get_many(const std::vector<Key>& keys) {
    std::vector<std::optional<std::string>> out;
    for (const auto& k : keys) out.push_back(get(k));
    return out;
  }
  // Overwrites each of `keys` with its value of `values`, at once where the backend can (a
  // store: one MULTI_SET).
  virtual void put_many(const std::vector<Key>& keys, const std::vector<std::string>& values, Lifetime life = Lifetime::run) {
    for (std::size_t i = 0; i < keys.size(); ++i) put(keys[i], values.at(i), life);
  }
  // Removes every key of the run but its `finished` marker: the job is over. Markers written
  // after it stay.
  virtual void clear_run() = 0;
  // Why `k`, a record on a node's lifetime, is missing, when the backend can tell (etcd: it went
  // with its lease), as a clause to append to a message; "" when it cannot.
  virtual std::string missing_why(const Key& k) {
    (void)k;
    return "";
  }
  // The key's full name in the backend, for messages.
  virtual std::string name(const Key& k) const = 0;
};

// This member's place in a running round, for its liveness watch: each member watches the next
// one (group rank + 1, mod the round's size), and knows nothing else of the others.
struct Members {
  int round = 0;
  int group_rank = 0;
  int group_world = 1;
  Key next_record{Name::node};  // the next member's node record (etcd: on its lease)
  std::string next_host;        // its host, for messages
  int next() const { return (group_rank + 1) % group_world; }
};

// What a liveness watch reports, from its own thread.
class LivenessEvents {
 public:
  virtual ~LivenessEvents() = default;
  // Group rank `g` of round `round` showed no sign of life for `idle_s` seconds.
  virtual void peer_lost(int round, int g, double idle_s) = 0;
  // The backend cannot be reached any more.
  virtual void lost(int round, const std::string& why) = 0;
};

// A running liveness watch: stops (bounded) when destroyed.
class Liveness {
 public:
  virtual ~Liveness() = default;
};

// A liveness watch whose work is `State::run()` on a thread of its own, until `State::stop` (a
// StopSignal) is given; destroying it gives the stop and waits up to `limit`. A thread stuck on
// an unreachable backend is left behind: it holds its State by shared_ptr.
template <typename State>
class LivenessThread : public Liveness {
 public:
  LivenessThread(std::shared_ptr<State> s, std::chrono::milliseconds limit) : state_(std::move(s)), limit_(limit) {
    thread_.start([st = state_] { st->run(); });
  }
  ~LivenessThread() override {
    state_->stop.stop();
    thread_.join_within(limit_);
  }

 private:
  std::shared_ptr<State> state_;
  std::chrono::milliseconds limit_;
  BoundedThread thread_;
};

// This node's liveness renewals, reported as the requests that renew it are sent.
class Renewals {
 public:
  virtual ~Renewals() = default;
  // The others cannot count this node lost before `sent` + the backend's liveness TTL.
  virtual void renewed(Clock::time_point sent) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Where nodes meet, for messages: "the rendezvous store at 10.0.0.1:29400", "etcd at h1:2379".
  virtual std::string where() const = 0;
  // A new connection whose calls are bounded by `timeout` (connecting too: a store that is not
  // up yet is retried that long). The first one also opens this node's session (etcd: its
  // lease). Throws ddprun::Error.
  virtual std::unique_ptr<Connection> connect(std::chrono::milliseconds timeout) = 0;
  // The job is over here: ends this node's session (etcd: revokes its lease). Bounded.
  virtual void close() {}
  // This node's rendezvous is shut down: its liveness is renewed no more (etcd: the lease keeper
  // stops, and the lease expires a TTL later unless close() revoked it). Bounded.
  virtual void stop_renewals() {}
  // The job ended here on an error, which no node acknowledges: a host keeps the records up at
  // exit, bounded, until the other nodes have left, so that they read the same cause and not a
  // lost store.
  virtual void linger_at_exit() {}
  // How long the backend may not answer and still come back (an etcd election): until then a
  // round's watch tries again. 0: unreachable is gone (a store whose host left).
  virtual std::chrono::milliseconds outage_tolerance() const { return std::chrono::milliseconds(0); }
  // What losing it usually means, for the message.
  virtual std::string lost_hint() const { return "its node left or crashed"; }
  // What to do when a request went unanswered for the whole time it was given (a backend that
  // may come back: outage_tolerance() > 0), for the message; empty: nothing to add.
  virtual std::string unanswered_hint() const { return ""; }
  // The address this node reaches the backend from.
  virtual std::string reach() const = 0;
  // The store this process hosts for the round records, if any (metrics). Any thread.
  virtual std::vector<HostedStore> hosted() const { return {}; }
  // This process holds the round records (it hosts the rendezvous store): it must keep them
  // until the other nodes have read how the job ended.
  virtual bool holds_records() const = 0;
  // A node whose liveness was last renewed by a request sent at t is counted lost by the others
  // at t + liveness_ttl() at the earliest.
  virtual std::chrono::milliseconds liveness_ttl() const = 0;
  // Keeps this node alive while a round runs (etcd: for the whole job) and watches the other
  // members of the round, until destroyed; losses go to `events` (while it exists). Renewals
  // of this node's liveness go to the Renewals the backend was built with. Throws when the
  // backend cannot be reached.
  virtual std::unique_ptr<Liveness> watch(const Members& m, std::weak_ptr<LivenessEvents> events) = 0;
  // For a node outside round `round`: are its first `members` arrivals all gone? True when none
  // renewed its liveness since the previous call (`seen` keeps what was read; calls a liveness
  // TTL apart). Unknown (the default): false.
  virtual bool members_silent(Connection& c, int round, int members, std::vector<long long>& seen) {
    (void)c, (void)round, (void)members, (void)seen;
    return false;
  }
};

// members_silent over the keep-alive counters r<R>/alive/<g> (the store backend's ring).
inline bool counters_silent(Connection& c, int round, int members, std::vector<long long>& seen) {
  std::vector<long long> now;
  for (int g = 0; g < members; ++g) now.push_back(c.add(round_key(round, Name::alive, g), 0));
  bool silent = now == seen;
  seen = std::move(now);
  return silent;
}
// members_silent over the members' node records (etcd: on their leases, gone with them).
inline bool records_gone(Connection& c, int round, int members) {
  for (int i = 0; i < members; ++i) {
    if (c.get(round_key(round, Name::node, i))) return false;
  }
  return true;
}

}  // namespace ddprun::rounds
