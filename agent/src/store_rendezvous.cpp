#include "store_rendezvous.hpp"

#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <spdlog/spdlog.h>
#include <thread>

#include "rendezvous_threads.hpp"
#include "coordinator.hpp"
#include "ddprun/agent/exit_status.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/rendezvous/store.hpp"

namespace ddprun::agent {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

}  // namespace

// The round being kept alive: touched on the coordinator thread only.
struct ActiveRound {
  int round = 0;
  int group_rank = 0;
  int group_world = 1;
  std::vector<std::string> hosts;
  long long neighbour = -2;  // the next node's keep-alive count when last read
  Clock::time_point neighbour_changed, next_alive, next_check;
};

struct StoreRendezvous::Core : std::enable_shared_from_this<Core> {
  RendezvousOptions opt;
  Coordinator coord;
  Post post;
  Listener* listener = nullptr;

  TaskQueue tasks;
  RoundEnds ended;

  // Coordinator thread only.
  bool connected = false;
  int group_world = 1;
  std::optional<ActiveRound> active;
  std::shared_ptr<rendezvous::Store> watch_store;  // watch thread only

  BoundedThread thread, watcher, announcer;

  Core(const RendezvousOptions& o, const std::string& run_id, int nproc, int node_rank, Post p)
      : opt(o), coord(o, run_id, nproc, node_rank), post(std::move(p)) {}

  std::string lost() const {
    return "lost the rendezvous store at " + coord.endpoint() + " (its node left or crashed)";
  }

  // The coordinator thread: requests in order; between them, the round's keep-alives.
  void run() {
    for (;;) {
      Clock::time_point wake = active ? std::min(active->next_alive, active->next_check) : Clock::now() + 1h;
      auto task = tasks.next(wake);
      if (!task) return;
      if (*task) {
        (*task)();
      } else {
        tick();
      }
    }
  }

  // Posts the end of `o.round`, once.
  void over(RoundOutcome o) {
    if (ended.claim(o.round)) post([l = listener, o = std::move(o)] { l->on_round_over(o); });
  }

  void do_join(int round, int restart_count) {
    try {
      if (!connected) {
        coord.connect();
        connected = true;
      }
      RoundInfo info = coord.join(round, restart_count);
      group_world = info.group_world;
      ActiveRound a;
      a.round = info.round;
      a.group_rank = info.group_rank;
      a.group_world = info.group_world;
      for (const auto& n : info.nodes) a.hosts.push_back(n.host);
      a.neighbour_changed = a.next_alive = a.next_check = Clock::now();
      active = a;
      post([l = listener, info] { l->on_round_ready(info); });
      watch(info.round);
    } catch (const JobStopped& e) {
      std::string msg = "the job was stopped by " + signal_name(e.signal) + " on host " + e.host + " during the rendezvous";
      post([l = listener, msg, code = 128 + e.signal] { l->on_rendezvous_failed(msg, code); });
    } catch (const std::exception& e) {
      post([l = listener, msg = std::string(e.what()), code = exit_code_for(e)] { l->on_rendezvous_failed(msg, code); });
    }
  }

  void watch(int round) {
    watcher.join_within(1s);  // the previous round's watch returned when that round ended
    watcher.start([self = shared_from_this(), round] {
      try {
        if (!self->watch_store) self->watch_store = self->coord.connect_watch();
        std::string raw = self->coord.wait_end(*self->watch_store, round);
        self->over(RoundOutcome{round, parse_round_end(self->coord.full_key(round, "end"), raw), {}});
      } catch (const ProtocolError& e) {
        self->over(RoundOutcome{round, std::nullopt, e.what()});
      } catch (const std::exception& e) {
        spdlog::debug("ddprun: watch of round {} ended: {}", round, e.what());
        self->over(RoundOutcome{round, std::nullopt, self->lost()});
      }
    });
  }

  // Keep-alives of this node; the next node's, watched (every interval / 4, at least 50 ms).
  void tick() {
    if (!active || ended.over(active->round)) {
      active.reset();
      return;
    }
    auto& a = *active;
    auto now = Clock::now();
    try {
      if (now >= a.next_alive) {
        coord.keep_alive(a.round, a.group_rank);
        a.next_alive = now + opt.keep_alive_interval;
      }
      if (now >= a.next_check) {
        a.next_check = now + std::max(opt.keep_alive_interval / 4, std::chrono::milliseconds(50));
        if (a.group_world > 1) check_neighbour(a, now);
      }
    } catch (const Error& e) {
      spdlog::debug("ddprun: keep-alive of round {} failed: {}", a.round, e.what());
      over(RoundOutcome{a.round, std::nullopt, lost()});
      active.reset();
    }
  }

  void check_neighbour(ActiveRound& a, Clock::time_point now) {
    int next = (a.group_rank + 1) % a.group_world;
    long long count = coord.alive_count(a.round, next);
    if (count != a.neighbour) {
      a.neighbour = count;
      a.neighbour_changed = now;
      return;
    }
    if (now - a.neighbour_changed <= opt.keep_alive_interval * opt.keep_alive_max_attempt) return;
    double idle = std::chrono::duration<double>(now - a.neighbour_changed).count();
    spdlog::warn("ddprun: round {}: no keep-alive from node {} for {:.1f} s", a.round, next, idle);
    std::string host = next < static_cast<int>(a.hosts.size()) ? a.hosts[next] : "?";
    coord.end_round(a.round, RoundEnd::of_node_lost(next, host, idle), a.group_world - 1);
    active.reset();  // the watch reports the end
  }

  // A request that ends or reports on the round: a store that does not answer ends it here.
  void guarded(int round, const char* what, const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      spdlog::error("ddprun: cannot reach the rendezvous store to {} of round {}: {}", what, round, e.what());
      over(RoundOutcome{round, std::nullopt, lost()});
    }
  }
};

StoreRendezvous::StoreRendezvous(const RendezvousOptions& opt, const std::string& run_id, int nproc, int node_rank,
                                 Post post)
    : core_(std::make_shared<Core>(opt, run_id, nproc, node_rank, std::move(post))) {
  core_->thread.start([c = core_] { c->run(); });
}

StoreRendezvous::~StoreRendezvous() { shutdown(); }

bool StoreRendezvous::is_host() const { return core_->coord.is_host(); }
std::string StoreRendezvous::endpoint() const { return core_->coord.endpoint(); }
std::uint16_t StoreRendezvous::endpoint_port() const { return core_->coord.endpoint_port(); }
void StoreRendezvous::set_listener(Listener& l) { core_->listener = &l; }

std::string StoreRendezvous::describe() const {
  const auto& o = core_->opt;
  return endpoint() + " (" + (o.dynamic ? "c10d, " : "static, ") + std::to_string(o.min_nodes) + " to " +
         std::to_string(o.max_nodes) + " nodes)";
}

void StoreRendezvous::join(int round, int restart_count) {
  core_->tasks.submit([c = core_.get(), round, restart_count] { c->do_join(round, restart_count); });
}

void StoreRendezvous::end_round(int round, const RoundEnd& why, int expect_next) {
  core_->tasks.submit([c = core_.get(), round, why, expect_next] {
    c->guarded(round, "end", [&] { c->coord.end_round(round, why, expect_next); });
  });
}

void StoreRendezvous::report_success(int round) {
  core_->tasks.submit([c = core_.get(), round] {
    c->guarded(round, "report the success", [&] { c->coord.report_success(round, c->group_world); });
  });
}

void StoreRendezvous::finish(int round, bool acknowledge) {
  core_->tasks.submit([c = core_.get(), round, acknowledge] {
    c->active.reset();
    if (acknowledge) {
      try {
        c->coord.acknowledge_end(round, c->group_world);
      } catch (const Error& e) {
        spdlog::debug("ddprun: could not acknowledge the end of round {}: {}", round, e.what());
      }
    }
    c->post([l = c->listener] { l->on_finished(); });
  });
}

void StoreRendezvous::leave(int round, int signal) {
  announce_stop(core_->announcer, core_->post, core_->listener, signal,
                [c = core_, round, signal] { c->coord.announce_stop(round, signal); });
}

void StoreRendezvous::shutdown() {
  if (!core_->tasks.stop()) return;
  // A joiner blocked in a WAIT is woken by a stop this node announced; one stuck on an
  // unreachable store is left behind.
  core_->thread.join_within(2s);
  core_->announcer.join_within(2s);
  core_->watcher.join_within(500ms);
}

}  // namespace ddprun::agent
