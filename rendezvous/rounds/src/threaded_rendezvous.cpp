#include "threaded_rendezvous.hpp"

#include <spdlog/spdlog.h>

#include "bounded_thread.hpp"
#include "ddprun/common/error.hpp"
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
  Listener* listener = nullptr;  // set before the first join

  // Any thread.
  TaskQueue tasks;
  RoundEnds ended;

  // Coordinator thread only.
  bool connected = false;
  int group_world = 1;
  std::vector<std::string> hosts;  // of the current round, by group rank
  std::unique_ptr<Liveness> liveness;
  // Watch thread only.
  std::unique_ptr<Connection> watch_conn;

  BoundedThread thread, watcher, announcer;

  Core(const RendezvousOptions& o, Post p, Fence* f) : opt(o), post(std::move(p)), fence(f) {}

  void run() {
    while (auto task = tasks.next(Clock::now() + 1h)) {
      if (*task) (*task)();
    }
    liveness.reset();  // a node shut down stops renewing its liveness at once
  }

  // Posts the end of `o.round`, once; the round's liveness watch stops.
  void over(RoundOutcome o) {
    if (!ended.claim(o.round)) return;
    post([l = listener, o] { l->on_round_over(o); });
    tasks.submit([this] { stop_liveness(); });
  }

  void stop_liveness() {
    liveness.reset();
    if (fence) fence->release();
  }

  void do_join(int round, int rc) {
    try {
      stop_liveness();
      if (!connected) {
        rules->connect();
        connected = true;
      }
      auto j = rules->join(round, rc);
      group_world = j.info.group_world;
      hosts = j.members.hosts;
      liveness = backend->watch(j.members, weak_from_this());
      post([l = listener, info = j.info] { l->on_round_ready(info); });
      watch(j.info.round);
    } catch (const std::exception& e) {
      post([l = listener, f = RendezvousFailure::of(e)] { l->on_rendezvous_failed(f); });
    }
  }

  void watch(int round) {
    watcher.join_within(1s);  // the previous round's watch returned when that round ended
    watcher.start([self = shared_from_this(), round] {
      try {
        if (!self->watch_conn) self->watch_conn = self->backend->connect(self->opt.read_timeout);
        self->over(RoundOutcome{round, self->rules->wait_end(*self->watch_conn, round), {}});
      } catch (const ProtocolError& e) {
        self->over(RoundOutcome{round, std::nullopt, RendezvousFailure::of(e)});
      } catch (const std::exception& e) {
        spdlog::debug("ddprun: watch of round {} ended: {}", round, e.what());
        self->over(RoundOutcome{round, std::nullopt, self->lost()});
      }
    });
  }

  RendezvousFailure lost() const {
    return {RendezvousFailure::Kind::unreachable, "lost " + backend->where() + " (its node left or crashed)", 0};
  }

  // A request that ends or reports on the round: a backend that does not answer ends it here.
  void guarded(int round, const char* what, const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      spdlog::error("ddprun: cannot reach {} to {} of round {}: {}", backend->where(), what, round, e.what());
      over(RoundOutcome{round, std::nullopt, lost()});
    }
  }

  // LivenessEvents, from the liveness thread.
  void peer_lost(int round, int g, double idle_s) override {
    tasks.submit([this, round, g, idle_s] {
      if (ended.over(round)) return;
      std::string host = g < static_cast<int>(hosts.size()) ? hosts[g] : "?";
      spdlog::warn("ddprun: round {}: no sign of life from node {} ({}) for {:.1f} s", round, g, host, idle_s);
      guarded(round, "end", [&] { rules->end_round(round, RoundEnd::of_node_lost(g, host, idle_s), group_world - 1); });
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
      self->post([l = self->listener] { l->on_finished(); });
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
  c.thread.start([core = core_] { core->run(); });
}

ThreadedRendezvous::~ThreadedRendezvous() { shutdown(); }

Backend& ThreadedRendezvous::backend() { return *core_->backend; }
void ThreadedRendezvous::set_listener(Listener& l) { core_->listener = &l; }

std::string ThreadedRendezvous::describe() const {
  const auto& o = core_->opt;
  return core_->backend->where() + " (" + RunConfig{o.backend, o.min_nodes, o.max_nodes}.describe() + ")";
}

void ThreadedRendezvous::join(int round, int restart_count) {
  core_->tasks.submit([c = core_.get(), round, restart_count] { c->do_join(round, restart_count); });
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
        c->rules->acknowledge_end(round, c->group_world);
      } catch (const Error& e) {
        spdlog::debug("ddprun: could not acknowledge the end of round {}: {}", round, e.what());
      }
    }
    c->backend->close();
    c->post([l = c->listener] { l->on_finished(); });
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
  // A joiner blocked in a wait is woken by a stop this node announced; one stuck on an
  // unreachable backend is left behind.
  core_->thread.join_within(2s);
  core_->announcer.join_within(2s);
  core_->watcher.join_within(1500ms);
}

}  // namespace ddprun::rounds
