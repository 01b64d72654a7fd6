#include "etcd_rendezvous_core.hpp"

namespace ddprun::agent {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using json = nlohmann::json;

}  // namespace

std::unique_ptr<EtcdClient> EtcdRendezvous::Core::client() const {
  EtcdOptions eo(endpoints, std::max<std::chrono::milliseconds>(opt.lease_ttl, 2s));
  eo.user = opt.etcd_user;
  eo.password = opt.etcd_password;
  return std::make_unique<EtcdClient>(eo);
}

void EtcdRendezvous::Core::run() {
  while (auto task = tasks.next(Clock::now() + 1h)) {
    if (*task) (*task)();
  }
}

void EtcdRendezvous::Core::over(RoundOutcome o) {
  if (ended.claim(o.round)) post([l = listener, o = std::move(o)] { l->on_round_over(o); });
}

void EtcdRendezvous::Core::start_lease() {
  lease = etcd->grant_lease(opt.lease_ttl);
  keeper.start([self = shared_from_this()] { self->keep_alive(); });
}

void EtcdRendezvous::Core::keep_alive() {
  auto c = client();
  for (;;) {
    if (tasks.wait_stopped_for(std::chrono::milliseconds(opt.lease_ttl) / 3)) return;
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

void EtcdRendezvous::Core::watch(const RoundInfo& info, const std::vector<std::string>& members) {
  watcher.join_within(1s);
  auto from = etcd->revision() + 1;
  watcher.start([self = shared_from_this(), info, members, from] { self->watch_round(info, members, from); });
}

void EtcdRendezvous::Core::watch_round(const RoundInfo& info, const std::vector<std::string>& members, std::int64_t from) {
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
  bool failing = false, read_end = false;
  while (!tasks.stopped()) {
    try {
      // An end written before `from` is read once; later ones arrive through the watch.
      if (!read_end) {
        if (auto v = c->get(end)) return ended(v->value);
        read_end = true;
      }
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

void EtcdRendezvous::Core::guarded(int round, const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    over(RoundOutcome{round, std::nullopt, "lost etcd at " + where() + ": " + e.what()});
  }
}

void EtcdRendezvous::Core::end_round(int round, RoundEnd why, int expect_next) {
  if (why.kind == RoundEnd::Kind::stopped) why.by = node_id;
  guarded(round, [&] {
    if (expect_next > 0) etcd->put(key(round + 1, "expect"), std::to_string(expect_next));
    etcd->create(key(round, "end"), round_end_json(why));
  });
}

void EtcdRendezvous::Core::report_success(int round) {
  guarded(round, [&] {
    etcd->put(key(round, "succeeded/" + node_id), "1");
    if (static_cast<int>(etcd->get_prefix(key(round, "succeeded/")).size()) >= group_world) {
      etcd->create(key(round, "end"), round_end_json(RoundEnd::of_success()));
    }
  });
}

void EtcdRendezvous::Core::finish(int round, bool acknowledge) {
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
  core_->tasks.submit([c = core_.get(), round, rc] { c->do_join(round, rc); });
}
void EtcdRendezvous::end_round(int round, const RoundEnd& why, int expect_next) {
  core_->tasks.submit([c = core_.get(), round, why, expect_next] { c->end_round(round, why, expect_next); });
}
void EtcdRendezvous::report_success(int round) {
  core_->tasks.submit([c = core_.get(), round] { c->report_success(round); });
}
void EtcdRendezvous::finish(int round, bool acknowledge) {
  core_->tasks.submit([c = core_.get(), round, acknowledge] { c->finish(round, acknowledge); });
}

void EtcdRendezvous::leave(int round, int signal) {
  announce_stop(core_->announcer, core_->post, core_->listener, signal, [c = core_, round, signal] {
    auto e = c->client();
    e->create(c->key(round, "end"), round_end_json(RoundEnd::of_stop(signal, host_name(), c->node_id)));
    if (c->lease) e->revoke(c->lease);
  });
}

void EtcdRendezvous::shutdown() {
  if (!core_->tasks.stop()) return;
  core_->thread.join_within(2s);
  core_->announcer.join_within(2s);
  core_->keeper.join_within(1s);
  core_->watcher.join_within(1500ms);
}

}  // namespace ddprun::agent
