#include "etcd_rendezvous.hpp"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <spdlog/spdlog.h>

#include "bounded_thread.hpp"
#include "coordinator.hpp"  // JobStopped
#include "ddprun/agent/exit_status.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/rendezvous/store_server.hpp"
#include "etcd_client.hpp"

namespace ddprun::agent {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using json = nlohmann::json;

std::string random_id() {
  std::random_device rd;
  char id[17];
  std::snprintf(id, sizeof(id), "%08x%08x", rd(), rd());
  return id;
}

}  // namespace

struct EtcdRendezvous::Core : std::enable_shared_from_this<Core> {
  RendezvousOptions opt;
  std::vector<EtcdEndpoint> endpoints;
  std::string prefix, node_id = random_id();
  int nproc;
  Post post;
  Listener* listener = nullptr;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> tasks;
  bool quit = false;
  std::atomic<std::int64_t> lease{0};
  std::atomic<int> current_round{0};  // the round this node is in (or joining)
  std::mutex over_mu;
  int last_over = -1;

  // Coordinator thread only.
  std::unique_ptr<EtcdClient> etcd;
  int group_world = 1;
  std::unique_ptr<rendezvous::StoreServer> worker_store;

  BoundedThread thread, watcher, keeper, announcer;

  Core(const RendezvousOptions& o, const std::string& run_id, int n, Post p)
      : opt(o), endpoints(parse_etcd_endpoints(o.etcd_endpoints)), prefix(o.etcd_prefix + "/" + run_id), nproc(n),
        post(std::move(p)) {}

  std::unique_ptr<EtcdClient> client() const {
    EtcdOptions eo(endpoints, std::max<std::chrono::milliseconds>(opt.lease_ttl, 2s));
    eo.user = opt.etcd_user;
    eo.password = opt.etcd_password;
    return std::make_unique<EtcdClient>(eo);
  }
  std::string key(int round, const std::string& name) const { return prefix + "/" + round_key(round, name); }
  std::string where() const { return opt.etcd_endpoints; }

  void submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lk(mu);
      tasks.push_back(std::move(task));
    }
    cv.notify_all();
  }
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return quit || !tasks.empty(); });
        if (quit) return;
        task = std::move(tasks.front());
        tasks.pop_front();
      }
      task();
    }
  }
  bool quitting() {
    std::lock_guard<std::mutex> lk(mu);
    return quit;
  }

  void over(RoundOutcome o) {
    {
      std::lock_guard<std::mutex> lk(over_mu);
      if (o.round <= last_over) return;
      last_over = o.round;
    }
    post([l = listener, o = std::move(o)] { l->on_round_over(o); });
  }

  // ---- the lease: this node's liveness -------------------------------------------------------

  void start_lease() {
    lease = etcd->grant_lease(opt.lease_ttl);
    keeper.start([self = shared_from_this()] { self->keep_alive(); });
  }

  void keep_alive() {
    auto c = client();
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu);
        if (cv.wait_for(lk, opt.lease_ttl / 3, [&] { return quit; })) return;
      }
      try {
        if (!c->keep_alive(lease)) {
          over(RoundOutcome{current_round.load(), std::nullopt,
                            "this node's etcd lease expired (etcd at " + where() + " did not hear from it for " +
                                duration_text(opt.lease_ttl) + "): the other nodes count it as lost"});
          return;
        }
      } catch (const Error& e) {
        // etcd unreachable for now: the next renewal tries again; if the lease expires meanwhile,
        // the renewal that reaches etcd says so (and the watch reports etcd lost).
        spdlog::debug("ddprun: etcd keep-alive failed: {}", e.what());
      }
    }
  }

  // ---- joining a round -------------------------------------------------------------------------

  void throw_if_stopped(int round) {
    auto end = etcd->get(key(round, "end"));
    if (!end) return;
    auto e = parse_round_end(key(round, "end"), end->value);
    if (e.kind == RoundEnd::Kind::stopped) throw JobStopped(e.signal > 0 ? e.signal : SIGTERM, e.host);
  }

  // The members of round `round` once it is closed (closing it when this arrival fills it or the
  // last call is over); throws TimeoutError when too few nodes join in time.
  std::vector<std::string> wait_closed(int round, Clock::time_point deadline) {
    std::optional<Clock::time_point> last_call;
    for (;;) {
      throw_if_stopped(round);
      if (auto closed = etcd->get(key(round, "closed"))) {
        auto j = json::parse(closed->value, nullptr, false);
        if (!j.is_array()) throw ProtocolError("rendezvous: malformed value at key '" + key(round, "closed") + "'");
        return j.get<std::vector<std::string>>();
      }
      auto joins = etcd->get_prefix(key(round, "join/"));
      auto rev = etcd->revision();
      int n = static_cast<int>(joins.size()), expect = opt.max_nodes;
      if (auto e = etcd->get(key(round, "expect"))) expect = std::clamp(static_cast<int>(parse_int(e->value).value_or(expect)), 1, opt.max_nodes);
      auto now = Clock::now();
      if (n >= opt.min_nodes && !last_call) last_call = now + opt.last_call_timeout;
      bool full = n >= opt.max_nodes || (n >= opt.min_nodes && n >= expect);
      if (full || (last_call && now >= *last_call)) {
        json members = json::array();
        for (int i = 0; i < std::min(n, opt.max_nodes); ++i) members.push_back(joins[i].key.substr(joins[i].key.rfind('/') + 1));
        etcd->create(key(round, "closed"), members.dump());
        continue;
      }
      if (!last_call && now >= deadline) {
        throw TimeoutError("rendezvous: only " + std::to_string(n) + " of the " + std::to_string(opt.min_nodes) +
                           " nodes needed joined round " + std::to_string(round) + " on etcd at " + where() +
                           " within " + duration_text(opt.join_timeout) + " (join_timeout); start the other nodes, or lower --nnodes");
      }
      auto until = last_call ? *last_call : deadline;
      etcd->watch(key(round, ""), true, rev + 1, std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(until - now), 1ms, 1000ms));
    }
  }

  RoundInfo read_round(int round, const std::vector<std::string>& members, int rc) {
    RoundInfo info;
    info.round = round;
    info.world_size = 0;
    info.group_world = static_cast<int>(members.size());
    for (int g = 0; g < info.group_world; ++g) {
      auto kv = etcd->get(key(round, "join/" + members[g]));
      NodeInfo n;
      if (kv) {
        n = parse_node(kv->key, kv->value);
      } else {  // gone already: the round ends at once
        n.host = "?";
        etcd->create(key(round, "end"), round_end_json(RoundEnd::of_node_lost(g, "?", 0)));
      }
      if (members[g] == node_id) info.group_rank = g;
      info.nodes.push_back(n);
    }
    for (int g = 0; g < info.group_world; ++g) {
      if (g < info.group_rank) info.rank_offset += info.nodes[g].nproc;
      info.world_size += info.nodes[g].nproc;
    }
    auto stored_rc = etcd->get(key(round, "rc"));
    info.restart_count = rc >= 0 ? rc : stored_rc ? static_cast<int>(parse_int(stored_rc->value).value_or(0)) : 0;
    publish_store(info);
    return info;
  }

  // The workers' store: hosted by group rank 0 of the round, emptied, published.
  void publish_store(RoundInfo& info) {
    const std::string k = key(info.round, "store");
    if (info.group_rank == 0) {
      if (!worker_store) {
        rendezvous::StoreServerOptions so;
        so.host = "";
        so.port = 0;
        so.same_user = true;
        so.allow = std::vector<std::string>{};
        worker_store = std::make_unique<rendezvous::StoreServer>(so);
        worker_store->start();
      }
      std::vector<std::string> allowed;
      for (const auto& n : info.nodes) allowed.insert(allowed.end(), n.addrs.begin(), n.addrs.end());
      worker_store->set_allow(allowed);
      worker_store->reset();
      std::string host = opt.local_addr.empty() ? host_name() : opt.local_addr;
      etcd->put(k, format_address(host, worker_store->port()));
    }
    const auto deadline = Clock::now() + opt.read_timeout;
    for (;;) {
      throw_if_stopped(info.round);
      if (auto v = etcd->get(k)) {
        auto colon = v->value.rfind(':');
        info.store_host = v->value.substr(0, colon);
        if (!info.store_host.empty() && info.store_host.front() == '[') info.store_host = info.store_host.substr(1, info.store_host.size() - 2);
        info.store_port = static_cast<std::uint16_t>(parse_int(v->value.substr(colon + 1), 0, 65535).value_or(0));
        return;
      }
      if (Clock::now() >= deadline) throw TimeoutError("rendezvous: group rank 0 did not publish the workers' store of round " + std::to_string(info.round));
      etcd->watch(k, false, etcd->revision() + 1, 500ms);
    }
  }

  void do_join(int round, int rc) {
    try {
      if (!etcd) {
        etcd = client();
        if (etcd->get(prefix + "/finished")) {
          throw Error("rendezvous: run id '" + prefix.substr(prefix.rfind('/') + 1) + "' already finished on etcd at " +
                      where() + "; give this job a new --rdzv_id");
        }
        start_lease();
      }
      NodeInfo me;
      me.host = opt.local_addr.empty() ? host_name() : opt.local_addr;
      me.addr = opt.local_addr;
      me.nproc = nproc;
      const auto deadline = Clock::now() + opt.join_timeout;
      for (;;) {
        if (rc < 0) {
          if (auto r = etcd->get(prefix + "/round")) round = std::max(round, static_cast<int>(parse_int(r->value).value_or(0)));
        }
        etcd->put(prefix + "/round", std::to_string(round));
        if (rc >= 0) etcd->put(key(round, "rc"), std::to_string(rc));
        etcd->put(key(round, "join/" + node_id), node_json(me), lease);
        auto members = wait_closed(round, deadline);
        if (std::find(members.begin(), members.end(), node_id) != members.end()) {
          current_round = round;
          auto info = read_round(round, members, rc);
          group_world = info.group_world;
          post([l = listener, info] { l->on_round_ready(info); });
          watch(info, members);
          return;
        }
        // The round runs without us: ask it to restart with us in, if it has room.
        if (static_cast<int>(members.size()) < opt.max_nodes) {
          etcd->put(key(round + 1, "expect"), std::to_string(members.size() + 1));
          etcd->create(key(round, "end"), round_end_json(RoundEnd::of_membership(me.host)));
        }
        spdlog::info("ddprun: round {} is full or closed ({} nodes); waiting for the next one", round, members.size());
        rc = -1;
        ++round;
      }
    } catch (const JobStopped& e) {
      std::string msg = "the job was stopped by " + signal_name(e.signal) + " on host " + e.host + " during the rendezvous";
      post([l = listener, msg, code = 128 + e.signal] { l->on_rendezvous_failed(msg, code); });
    } catch (const std::exception& e) {
      post([l = listener, msg = std::string(e.what()), code = exit_code_for(e)] { l->on_rendezvous_failed(msg, code); });
    }
  }

  // ---- the end of a round ------------------------------------------------------------------------

  // Waits for round `info.round` to end; a member whose key vanishes (its lease expired) is lost.
  void watch(const RoundInfo& info, const std::vector<std::string>& members) {
    watcher.join_within(1s);
    auto from = etcd->revision() + 1;
    watcher.start([self = shared_from_this(), info, members, from] { self->watch_round(info, members, from); });
  }

  void watch_round(const RoundInfo& info, const std::vector<std::string>& members, std::int64_t from) {
    auto c = client();
    const std::string end = key(info.round, "end");
    auto ended = [&](const std::string& value) {
      try {
        over(RoundOutcome{info.round, parse_round_end(end, value), {}});
      } catch (const ProtocolError& e) {
        over(RoundOutcome{info.round, std::nullopt, e.what()});
      }
    };
    auto failing_since = Clock::now();
    bool failing = false;
    while (!quitting()) {
      try {
        if (auto v = c->get(end)) return ended(v->value);
        for (const auto& ev : c->watch(key(info.round, ""), true, from, 1s)) {
          from = std::max(from, ev.kv.mod_revision + 1);
          if (ev.kv.key == end && !ev.deleted) return ended(ev.kv.value);
          auto slash = ev.kv.key.rfind('/');
          if (!ev.deleted || ev.kv.key.find("/join/") == std::string::npos) continue;
          auto id = ev.kv.key.substr(slash + 1);
          auto it = std::find(members.begin(), members.end(), id);
          if (it == members.end()) continue;
          int g = static_cast<int>(it - members.begin());
          spdlog::warn("ddprun: round {}: node {} ({}) lost its etcd lease", info.round, g, info.nodes[g].host);
          c->create(end, round_end_json(RoundEnd::of_node_lost(g, info.nodes[g].host, opt.lease_ttl.count())));
          if (info.group_world > 1) c->put(key(info.round + 1, "expect"), std::to_string(info.group_world - 1));
        }
        failing = false;
      } catch (const Error& e) {
        if (!failing) failing_since = Clock::now();
        failing = true;
        if (Clock::now() - failing_since > opt.read_timeout) {
          return over(RoundOutcome{info.round, std::nullopt, "lost etcd at " + where() + ": " + e.what()});
        }
        std::this_thread::sleep_for(100ms);
      }
    }
  }

  void guarded(int round, const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      over(RoundOutcome{round, std::nullopt, "lost etcd at " + where() + ": " + e.what()});
    }
  }

  void end_round(int round, RoundEnd why, int expect_next) {
    if (why.kind == RoundEnd::Kind::stopped) why.by = node_id;
    guarded(round, [&] {
      if (expect_next > 0) etcd->put(key(round + 1, "expect"), std::to_string(expect_next));
      etcd->create(key(round, "end"), round_end_json(why));
    });
  }

  void report_success(int round) {
    guarded(round, [&] {
      etcd->put(key(round, "succeeded/" + node_id), "1");
      if (static_cast<int>(etcd->get_prefix(key(round, "succeeded/")).size()) >= group_world) {
        etcd->create(key(round, "end"), round_end_json(RoundEnd::of_success()));
      }
    });
  }

  // The job is over here. The last node to acknowledge deletes the run's keys; this node's lease
  // goes (its join keys with it).
  void finish(int round, bool acknowledge) {
    try {
      if (acknowledge && etcd) {
        etcd->put(key(round, "acked/" + node_id), "1");
        if (static_cast<int>(etcd->get_prefix(key(round, "acked/")).size()) >= group_world) {
          // Nothing of the job stays but a marker, on a lease of 10 minutes: a node started late
          // with the same run id is told the job finished instead of waiting for a rendezvous.
          etcd->delete_prefix(prefix + "/");
          etcd->put(prefix + "/finished", "1", etcd->grant_lease(std::chrono::seconds(600)));
        }
      }
      if (etcd && lease) etcd->revoke(lease);
    } catch (const Error& e) {
      spdlog::debug("ddprun: etcd clean-up: {}", e.what());
    }
    post([l = listener] { l->on_finished(); });
  }
};

EtcdRendezvous::EtcdRendezvous(const RendezvousOptions& opt, const std::string& run_id, int nproc, Post post)
    : core_(std::make_shared<Core>(opt, run_id, nproc, std::move(post))) {
  core_->thread.start([c = core_] { c->run(); });
}

EtcdRendezvous::~EtcdRendezvous() { shutdown(); }
void EtcdRendezvous::set_listener(Listener& l) { core_->listener = &l; }

std::string EtcdRendezvous::describe() const {
  const auto& o = core_->opt;
  return "etcd " + o.etcd_endpoints + " (" + std::to_string(o.min_nodes) + " to " + std::to_string(o.max_nodes) + " nodes)";
}

void EtcdRendezvous::join(int round, int rc) {
  core_->submit([c = core_.get(), round, rc] { c->do_join(round, rc); });
}
void EtcdRendezvous::end_round(int round, const RoundEnd& why, int expect_next) {
  core_->submit([c = core_.get(), round, why, expect_next] { c->end_round(round, why, expect_next); });
}
void EtcdRendezvous::report_success(int round) {
  core_->submit([c = core_.get(), round] { c->report_success(round); });
}
void EtcdRendezvous::finish(int round, bool acknowledge) {
  core_->submit([c = core_.get(), round, acknowledge] { c->finish(round, acknowledge); });
}

void EtcdRendezvous::leave(int round, int signal) {
  core_->announcer.join_within(0ms);
  core_->announcer.start([c = core_, round, signal] {
    try {
      auto e = c->client();
      e->create(c->key(round, "end"), round_end_json(RoundEnd::of_stop(signal, host_name(), c->node_id)));
      if (c->lease) e->revoke(c->lease);
    } catch (const Error& err) {
      spdlog::warn("ddprun: could not tell the other nodes about {}: {}", signal_name(signal), err.what());
    }
    c->post([l = c->listener] { l->on_finished(); });
  });
}

void EtcdRendezvous::shutdown() {
  {
    std::lock_guard<std::mutex> lk(core_->mu);
    if (core_->quit) return;
    core_->quit = true;
  }
  core_->cv.notify_all();
  core_->thread.join_within(2s);
  core_->announcer.join_within(2s);
  core_->keeper.join_within(1s);
  core_->watcher.join_within(1500ms);
}

}  // namespace ddprun::agent
