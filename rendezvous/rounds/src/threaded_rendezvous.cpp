#include <atomic>
#include "threaded_rendezvous.hpp"

#include <spdlog/spdlog.h>

#include "bounded_thread.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"
#include "rendezvous_error.hpp"
#include "round_rules.hpp"
#include "round_state.hpp"
#include "task_queue.hpp"
#include "workers_store.hpp"

namespace ddprun::rounds {
namespace {

using namespace std::chrono_literals;

}  // namespace

std::chrono::milliseconds fence_margin(std::chrono::milliseconds ttl) { return std::min<std::chrono::milliseconds>(ttl / 4, 2s); }

struct ThreadedRendezvous::Core : LivenessEvents, Renewals, std::enable_shared_from_this<Core> {
  // Constant after construction.
  RendezvousOptions opt;
  Post post;
  Fence* fence;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<WorkersStore> workers;
  std::unique_ptr<RoundRules> rules;
  std::mutex listener_mu;
  Listener* listener = nullptr;  // set before the first join; cleared at shutdown

  // Any thread.
  TaskQueue tasks;
  RoundEnds ended;
  std::atomic<int> succeeded_round{-1};  // the last round whose end was "success"

  // Coordinator thread only.
  bool connected = false;
  int group_world = 1;
  std::string next_host;  // of the member after this one in the current round (the one it watches)
  int next = -1;          // its group rank
  std::unique_ptr<Liveness> liveness;
  int liveness_round = -1;  // the round `liveness` watches
  // Watch thread only.
  std::unique_ptr<Connection> watch_conn;

  BoundedThread thread, watcher, announcer;
  StopSignal retry_pause;  // the watch's pause between tries, cut short at shutdown

  Core(const RendezvousOptions& o, Post p, Fence* f) : opt(o), post(std::move(p)), fence(f) {}

  // Posts `f` for the listener; nothing once shut down (a thread left behind may wake late).
  void tell(std::function<void(Listener&)> f) {
    std::lock_guard<std::mutex> lk(listener_mu);
    if (listener) post([l = listener, f = std::move(f)] { f(*l); });
  }

  void run() {
    while (auto task = tasks.next(Clock::now() + 1h)) {
      if (*task) (*task)();
    }
    liveness.reset();  // a node shut down stops renewing its liveness at once
  }

  // Posts the end of `o.round`, once; the round's liveness watch stops.
  void over(RoundOutcome o) {
    // After shutdown nothing is told: the listener may be gone (a thread left behind wakes late).
    if (tasks.stopped() || !ended.claim(o.round)) return;
    if (o.end && o.end->kind == RoundEnd::Kind::success) succeeded_round = o.round;
    // Only this round's watch: the loop may have joined the next round already.
    tasks.submit([this, r = o.round] {
      if (liveness_round == r) stop_liveness();
    });
    tell([o](Listener& l) { l.on_round_over(o); });
  }

  void stop_liveness() {
    liveness.reset();
    liveness_round = -1;
    if (fence) fence->release();
  }

  void do_join(int round, int rc, const Streak& streak, const StateOffer& state) {
    try {
      stop_liveness();
      if (!connected) {
        rules->connect();
        connected = true;
      }
      auto j = rules->join(round, rc, streak, state);
      group_world = j.info.group_world;
      next_host = j.members.next_host;
      next = j.members.next();
      liveness = backend->watch(j.members, weak_from_this());
      liveness_round = j.info.round;
      tell([info = j.info](Listener& l) { l.on_round_ready(info); });
      watch(j.info.round);
    } catch (const std::exception& e) {
      auto f = RendezvousFailure::of(e);
      // Connected once, then unreachable or silent: the backend was lost; say what that means.
      if (connected && (f.kind == RendezvousFailure::Kind::unreachable || f.kind == RendezvousFailure::Kind::timeout) &&
          !dynamic_cast<const RendezvousError*>(&e)) {
        if (backend->outage_tolerance() == 0ms) {
          f = lost(e.what());
          // (a host node that gave up waiting for nodes leaves with the store: the others are joining)
          f.message += "; where a node hosted it: it leaves when it reaches its join_timeout";
        } else {
          // One request of the join went unanswered for the time it was given, not for the
          // watch's ride-out that lost_hint() names.
          const auto hint = backend->unanswered_hint();
          f = {RendezvousFailure::Kind::unreachable,
               "lost " + backend->where() + " while joining: " + e.what() + (hint.empty() ? "" : "; " + hint), 0};
        }
      }
      // Not yet connected: a backend that took the requests and answered none in time is slow,
      // not gone; say what gives it longer.
      if (!connected && dynamic_cast<const UnansweredError*>(&e)) {
        const auto hint = backend->unanswered_hint();
        if (!hint.empty()) f.message += "; " + hint;
      }
      tell([f](Listener& l) { l.on_rendezvous_failed(f); });
    }
  }

  void watch(int round) {
    watcher.join_within(1s);  // the previous round's watch returned when that round ended
    watcher.start([self = shared_from_this(), round] { self->watch_end(round); });
  }

  // Waits for the round's end on a connection of its own. A backend that stops answering is
  // tried again for as long as it may be away and come back (etcd electing a leader); a store
  // whose host is gone is lost at once.
  void watch_end(int round) {
    std::optional<Clock::time_point> failing_since;
    while (!tasks.stopped() && !ended.over(round)) {
      try {
        if (!watch_conn) watch_conn = backend->connect(opt.read_timeout);
        return over(RoundOutcome{round, rules->wait_end(*watch_conn, round), {}});
      } catch (const ProtocolError& e) {
        return over(RoundOutcome{round, std::nullopt, RendezvousFailure::of(e)});
      } catch (const RendezvousError& e) {  // the job finished while this node was away
        return over(RoundOutcome{round, std::nullopt, e.failure});
      } catch (const std::exception& e) {
        spdlog::debug("ddprun: watch of round {}: {}", round, e.what());
        watch_conn.reset();
        if (!failing_since) failing_since = Clock::now();
        if (Clock::now() - *failing_since >= backend->outage_tolerance()) return over(RoundOutcome{round, std::nullopt, lost(e.what())});
        retry_pause.wait_for(200ms);
      }
    }
  }

  RendezvousFailure lost(const std::string& why = "") const {
    return {RendezvousFailure::Kind::unreachable, "lost " + backend->where() + ": " + backend->lost_hint() +
                                                      (why.empty() ? "" : " (" + why + ")"), 0};
  }

  // A request that ends or reports on the round: a backend that does not answer ends it here.
  void guarded(int round, const char* what, const std::function<void()>& f) {
    try {
      f();
    } catch (const std::exception& e) {
      spdlog::error("ddprun: cannot reach {} to {} of round {}: {}", backend->where(), what, round, e.what());
      // A backend that may come back (etcd) was not waited for here: its outage hint would say it was.
      if (backend->outage_tolerance() == 0ms) return over(RoundOutcome{round, std::nullopt, lost(e.what())});
      over(RoundOutcome{round, std::nullopt, {RendezvousFailure::Kind::unreachable, "lost " + backend->where() + ": " + e.what(), 0}});
    }
  }

  // LivenessEvents, from the liveness thread.
  void peer_lost(int round, int g, double idle_s) override {
    // Its last sign of life, on this node's wall clock, taken as the watch found it silent:
    // every node times its detection from it.
    const auto since = Clock::wall() - std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                           std::chrono::duration<double>(idle_s));
    tasks.submit([this, round, g, idle_s, since] {
      if (ended.over(round)) return;
      std::string host = g == next ? next_host : "?";
      spdlog::warn("ddprun: round {}: no sign of life from node {} ({}) for {:.1f} s", round, g, escape_for_log(host), idle_s);
      guarded(round, "end",
              [&] { rules->end_round(round, RoundEnd::of_node_lost(g, host, idle_s, since), group_world - 1); });
    });
  }
  void lost(int round, const std::string& why) override {
    over(RoundOutcome{round, std::nullopt, {RendezvousFailure::Kind::unreachable, why, 0}});
  }

  // Renewals, from whichever thread renewed.
  void renewed(Clock::time_point sent) override {
    const auto ttl = backend->liveness_ttl();
    if (fence) fence->renewed_until(sent + ttl - fence_margin(ttl));
  }

  void announce(int asked, int signal) {
    announcer.join_within(0ms);
    announcer.start([self = shared_from_this(), asked, signal] {
      try {
        int round = self->rules->round_to_tell(asked);
        if (round >= 0) {
          auto c = self->backend->connect(1s);
          self->rules->announce_stop(*c, round, signal);
        }
      } catch (const Error& e) {
        spdlog::warn("ddprun: could not tell the other nodes about {}: {}", signal_name(signal), e.what());
      }
      self->tell([](Listener& l) { l.on_finished(); });
    });
  }
};

ThreadedRendezvous::ThreadedRendezvous(const RendezvousOptions& opt, const BackendFactory& make_backend, Post post,
                                       Fence* fence)
    : core_(std::make_shared<Core>(opt, std::move(post), fence)) {
  auto& c = *core_;
  c.backend = make_backend(core_);
  c.workers = std::make_unique<WorkersStore>(opt.local_addr, 64 + 8 * static_cast<std::size_t>(opt.nproc));
  c.rules = std::make_unique<RoundRules>(c.opt, *c.backend, *c.workers, describe_self(opt, c.backend->reach()));
  c.rules->on_waiting([core = core_.get()] { core->tell([](Listener& l) { l.on_waiting_for_place(); }); });
  c.thread.start([core = core_] { core->run(); });
}

ThreadedRendezvous::~ThreadedRendezvous() { shutdown(); }

Backend& ThreadedRendezvous::backend() { return *core_->backend; }
void ThreadedRendezvous::set_listener(Listener& l) {
  std::lock_guard<std::mutex> lk(core_->listener_mu);
  core_->listener = &l;
}

std::string ThreadedRendezvous::describe() const {
  const auto& o = core_->opt;
  return core_->backend->where() + " (" + RunConfig{o.backend, o.min_nodes, o.max_nodes}.describe() + ")";
}

void ThreadedRendezvous::join(int round, int restart_count, const Streak& streak, const StateOffer& state) {
  core_->tasks.submit([c = core_.get(), round, restart_count, streak, state] {
    c->do_join(round, restart_count, streak, state);
  });
}

void ThreadedRendezvous::end_round(int round, const RoundEnd& why, int expect_next) {
  core_->tasks.submit([c = core_.get(), round, why, expect_next] {
    c->guarded(round, "end", [&] { c->rules->end_round(round, why, expect_next); });
  });
}

void ThreadedRendezvous::report_success(int round) {
  core_->tasks.submit([c = core_.get(), round] {
    c->guarded(round, "report the success", [&] { c->rules->report_success(round, c->group_world); });
  });
}

void ThreadedRendezvous::finish(int round, Ack ack) {
  core_->tasks.submit([c = core_.get(), round, ack] {
    c->stop_liveness();
    if (ack == Ack::yes && c->connected) {
      try {
        c->rules->acknowledge_end(round, c->group_world, c->succeeded_round.load() == round);
      } catch (const Error& e) {
        spdlog::debug("ddprun: could not acknowledge the end of round {}: {}", round, e.what());
      }
    }
    if (ack == Ack::no) c->backend->linger_at_exit();
    c->backend->close();
    c->tell([](Listener& l) { l.on_finished(); });
  });
}

void ThreadedRendezvous::leave(int round, int signal) { core_->announce(round, signal); }

std::vector<HostedStore> ThreadedRendezvous::hosted_stores() const {
  std::vector<HostedStore> out = core_->backend->hosted();
  if (auto w = core_->workers->observe()) out.push_back(*w);
  return out;
}

void ThreadedRendezvous::shutdown() {
  if (!core_->tasks.stop()) return;
  core_->retry_pause.stop();
  // A joiner blocked in a wait is woken by a stop this node announced; one stuck on an
  // unreachable backend is left behind.
  core_->thread.join_within(2s);
  core_->announcer.join_within(2s);
  core_->watcher.join_within(1500ms);
  core_->backend->stop_renewals();
  std::lock_guard<std::mutex> lk(core_->listener_mu);
  core_->listener = nullptr;
}

}  // namespace ddprun::rounds
