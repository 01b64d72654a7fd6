#include "etcd_backend.hpp"

#include "etcd_lease_keeper.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <spdlog/spdlog.h>

#include "ddprun/common/error.hpp"
#include "ddprun/common/net.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/common/text.hpp"
#include "task_queue.hpp"
#include "threaded_rendezvous.hpp"

namespace ddprun::rounds {
namespace {

using namespace std::chrono_literals;

// Markers outlive the run this long (a node started late is told the job finished).
constexpr std::chrono::seconds kMarkerTtl{600};

std::vector<std::string> hosts_of(const std::vector<EtcdEndpoint>& endpoints) {
  std::vector<std::string> out;
  for (const auto& e : endpoints) out.push_back(e.host);
  return out;
}

class EtcdConnection : public Connection {
 public:
  EtcdConnection(std::shared_ptr<EtcdClient> c, std::string prefix, std::shared_ptr<EtcdBackend::Lease> lease)
      : c_(std::move(c)), prefix_(std::move(prefix)), lease_(std::move(lease)) {}

  std::optional<std::string> get(const Key& k) override {
    auto kv = c_->get(name(k));
    if (!kv) return std::nullopt;
    return kv->value;
  }
  // Keys of one family (a round's records): one range read of the family's prefix.
  std::vector<std::optional<std::string>> get_many(const std::vector<Key>& keys) override {
    const bool family = keys.size() > 1 && std::all_of(keys.begin(), keys.end(), [&](const Key& k) {
      return k.index >= 0 && k.family() == keys[0].family();
    });
    if (!family) return Connection::get_many(keys);
    std::map<std::string, std::string> present;
    for (auto& kv : c_->get_prefix(prefix_ + "/" + keys[0].family())) present[kv.key] = std::move(kv.value);
    std::vector<std::optional<std::string>> out;
    for (const auto& k : keys) {
      auto it = present.find(name(k));
      if (it == present.end()) {
        out.emplace_back();
      } else {
        out.emplace_back(it->second);
      }
    }
    return out;
  }
  void put(const Key& k, const std::string& value, Lifetime life) override {
    with_lease(life, [&](std::int64_t lease) { c_->put(name(k), value, lease); });
  }
  // One transaction (per 128 keys).
  void put_many(const std::vector<Key>& keys, const std::vector<std::string>& values, Lifetime life) override {
    std::vector<std::string> names;
    for (const auto& k : keys) names.push_back(name(k));
    with_lease(life, [&](std::int64_t lease) { c_->put_all(names, values, lease); });
  }
  std::string create(const Key& k, const std::string& value, Lifetime life) override {
    EtcdKv existing;
    bool made = false;
    with_lease(life, [&](std::int64_t lease) { made = c_->create(name(k), value, lease, &existing); });
    return made ? value : existing.value;
  }
  // One transaction per add, whatever the contention (EtcdClient::counter_add). Each add carries
  // a token of its own: a transaction a member applied but answered too late, so that the client
  // tried it again on another member, is then recognised as ours, not counted twice.
  std::int64_t add(const Key& k, std::int64_t delta) override {
    if (delta == 0) return c_->counter(name(k));
    return c_->counter_add(name(k), delta, token_ + "-" + std::to_string(++writes_));
  }
  // The keys read at once (a family's: one range read, as get_many), then a watch on the first
  // missing one, at most a second, again and again; read anew only after a watch that was not
  // quiet (an event, a cancel, no member serving it): at rest, one watch a second.
  bool wait(const std::vector<Key>& keys, Clock::time_point deadline) override {
    if (keys.empty()) return true;
    const Key* missing = nullptr;
    std::int64_t from = 0;
    bool quiet = false;
    for (;;) {
      if (!quiet) {
        missing = nullptr;
        const auto values = keys.size() > 1 ? get_many(keys) : std::vector<std::optional<std::string>>{get(keys.at(0))};
        for (std::size_t i = 0; i < keys.size() && !missing; ++i) {
          if (!values[i]) missing = &keys[i];
        }
        if (!missing) return true;
        from = c_->revision() + 1;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left <= 0ms) return false;
      c_->watch(name(*missing), false, from, std::min<std::chrono::milliseconds>(left, 1s), &quiet);
    }
  }
  void clear_run() override { c_->delete_prefix(prefix_ + "/"); }
  // A record on a lease that is missing now was either never written or went with its lease:
  // the key's history (a watch from the first revision, while etcd has not compacted it) tells.
  std::string missing_why(const Key& k) override {
    try {
      for (const auto& e : c_->watch(name(k), false, 1, 200ms)) {
        if (!e.deleted) continue;
        return "; its record was written, then went with its etcd lease: etcd heard no renewal from that node for "
               "lease_ttl (" + duration_text(std::chrono::duration_cast<std::chrono::milliseconds>(lease_->ttl)) +
               "): it died, was cut off, or its machine was too loaded to run its lease keeper (then raise --rdzv_conf "
               "lease_ttl)";
      }
    } catch (const Error& e) {
      spdlog::debug("ddprun: the history of {}: {}", name(k), e.what());
    }
    return "";
  }
  // The finished marker lives beside the run's keys (<prefix>/<run_id>.finished): clearing the
  // run keeps it.
  std::string name(const Key& k) const override {
    return k.name == Name::finished ? prefix_ + ".finished" : prefix_ + "/" + k.text();
  }

 private:
  // Runs `write` with the lease for `life`. This node's lease found expired (it was stopped, or
  // cut off from etcd, longer than the TTL; the keeper may not have noticed yet) is replaced and
  // the write made again on the new one: the others counted this node lost, it joins as new.
  template <class F>
  void with_lease(Lifetime life, F write) {
    const auto lease = lease_for(life);
    try {
      write(lease);
    } catch (const Error& e) {
      if (life != Lifetime::node || std::string(e.what()).find("requested lease not found") == std::string::npos) throw;
      write(lease_->replace(*c_, lease));
    }
  }
  std::int64_t lease_for(Lifetime life) {
    if (life == Lifetime::node) return lease_->id;
    if (life == Lifetime::marker) return c_->grant_lease(kMarkerTtl);
    return 0;
  }

  std::shared_ptr<EtcdClient> c_;  // the first one's also granted the lease (a stop interrupts it)
  std::string prefix_;
  std::shared_ptr<EtcdBackend::Lease> lease_;
  std::string token_ = random_token();
  std::uint64_t writes_ = 0;

  static std::string random_token() { return random_hex(16); }
};

// The next member of the round (by group rank, as the store's keep-alive ring) watched for its
// node record vanishing (its lease expired). One key per member: a lost member is seen by the
// one before it, which ends the round for all.
struct RecordWatch {
  std::unique_ptr<EtcdClient> c;
  Members m;
  std::chrono::milliseconds ttl, give_up;
  std::string prefix;
  std::weak_ptr<LivenessEvents> events;
  std::int64_t from = 0;
  StopSignal stop;

  std::string full(const std::string& rel) const { return prefix + "/" + rel; }
  void lost_member(int g) {
    spdlog::warn("ddprun: round {}: node {} ({}) lost its etcd lease: etcd heard no renewal from it for lease_ttl ({}): "
                 "it died, was cut off, or its machine was too loaded to run its lease keeper (then raise --rdzv_conf "
                 "lease_ttl)",
                 m.round, g, escape_for_log(m.next_host), duration_text(ttl));
    if (auto e = events.lock()) e->peer_lost(m.round, g, std::chrono::duration<double>(ttl).count());
  }
  // Reads the next member's record (gone: that member is lost, at once, also one that died as
  // the round closed), then watches it for a change, a lease TTL at a time (a stop interrupts
  // the watch). The record is read anew after anything but a quiet watch, rather than the state
  // pieced together from events: a watch from a revision etcd has compacted away is cancelled,
  // and events could be missed that way. So a member at rest costs etcd one watch per TTL; the
  // record is read at least once a minute all the same, so that a watch never starts from a
  // revision far behind (etcd replays the history since it to a new watch).
  void run() {
    const int next = m.next();
    const std::string key = full(m.next_record.text());
    auto failing_since = Clock::now(), read_at = Clock::now();
    bool failing = false, quiet = false;
    stop.also_on_stop([client = c.get()] { client->interrupt(); });
    while (!stop.stopped()) {
      try {
        if (!quiet || Clock::now() - read_at > 1min) {
          const bool present = c->get(key).has_value();
          from = c->revision() + 1;
          read_at = Clock::now();
          if (!present) {
            // Gone after the round's end was written: that member left when the job was done
            // (its lease revoked), before this node read the end; it was not lost.
            if (!c->get(full(round_key(m.round, Name::end).text()))) lost_member(next);
            return;
          }
        }
        c->watch(key, false, from, ttl, &quiet);
        failing = false;
      } catch (const Error& e) {
        if (!failing) failing_since = Clock::now();
        failing = true;
        if (Clock::now() - failing_since > give_up) {
          if (auto ev = events.lock()) ev->lost(m.round, std::string("lost etcd: ") + e.what());
          return;
        }
        stop.wait_for(100ms);
      }
    }
  }
};

}  // namespace

static std::string expired_text(const EtcdBackend::Lease& lease) {
  const auto unheard = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - lease.renewed());
  const auto ttl = std::chrono::duration_cast<std::chrono::milliseconds>(lease.ttl);
  if (unheard < ttl) {  // held in time, and gone all the same: etcd revoked it
    return "this node's etcd lease is gone although it was held " + duration_text(unheard) +
           " ago (its last renewal that got through, or a leaderless majority's hold), within lease_ttl (" +
           duration_text(ttl) +
           "): etcd revoked it (a leader paused past the lease revokes leases as it resumes, in etcd without the fix of "
           "etcd-io/etcd#12528: upgrade etcd; docs/multi-node.md, etcd failover). The other nodes count this node as "
           "lost; it joins again on a new lease";
  }
  return "this node's etcd lease expired: its last renewal that got through was sent " + duration_text(unheard) +
         " ago, past lease_ttl (" + duration_text(ttl) + "; renewed every " + duration_text(etcd_renewal_interval(ttl)) +
         "): this machine did not run its lease keeper, or it could not reach etcd, for that long (a loaded or paused "
         "machine, or a network cut). The other nodes count this node as lost; it joins again on a new lease. On a loaded "
         "machine, raise --rdzv_conf lease_ttl (docs/multi-node.md: the lease TTL you can trust)";
}

std::int64_t EtcdBackend::Lease::replace(EtcdClient& c, std::int64_t stale) {
  std::lock_guard<std::mutex> lk(mu);
  if (id != stale) return id;
  // No lease without a keeper (or a revoke) after a stop.
  if (stop.stopped()) throw Error("no new etcd lease: ddprun is stopping");
  spdlog::warn("ddprun: {}", expired_text(*this));
  id = c.grant_lease(ttl);
  term = c.lease_term();
  renewed_at(c.last_sent());
  return id;
}

std::chrono::milliseconds etcd_attempt(std::chrono::milliseconds ttl) {
  return std::max<std::chrono::milliseconds>(fence_margin(ttl) / 2, 100ms);
}

std::chrono::milliseconds etcd_keepalive_attempt(std::chrono::milliseconds ttl) {
  return std::max<std::chrono::milliseconds>(etcd_attempt(ttl) / 2, 100ms);
}

std::chrono::milliseconds etcd_renewal_interval(std::chrono::milliseconds ttl) {
  return std::max<std::chrono::milliseconds>(ttl / 10, 100ms);
}

std::chrono::milliseconds etcd_renewal_patience(std::chrono::milliseconds ttl, std::chrono::milliseconds left) {
  const auto attempt = etcd_keepalive_attempt(ttl);
  return std::max<std::chrono::milliseconds>((left - 2 * attempt) / 2, attempt);
}

EtcdBackend::EtcdBackend(const RendezvousOptions& opt, std::weak_ptr<Renewals> renewals)
    : opt_(opt), endpoints_(parse_etcd_endpoints(opt.etcd_endpoints, !opt.etcd_cacert.empty())),
      names_(hosts_of(endpoints_), opt.endpoint_host_setting, opt.join_timeout), prefix_(opt.etcd_prefix + "/" + opt.run_id),
      renewals_(std::move(renewals)) {}

EtcdBackend::~EtcdBackend() {
  lease_->stop.stop();
  keeper_.join_within(1s);
}

// etcd answers in milliseconds: a call is bounded by the lease's TTL (at least 2 s), so that a
// node cut off from etcd knows within about a TTL. Each member gets half the fence's margin to
// answer before the next is tried: one paused or cut off costs that, not the fence.
std::unique_ptr<EtcdClient> EtcdBackend::client(std::chrono::milliseconds timeout) const {
  EtcdOptions eo(endpoints_, std::min(timeout, std::max<std::chrono::milliseconds>(opt_.lease_ttl, 2s)));
  eo.attempt = etcd_attempt(opt_.lease_ttl);
  eo.user = opt_.etcd_user;
  eo.password = opt_.etcd_password;
  eo.tls = {opt_.etcd_cacert, opt_.etcd_cert, opt_.etcd_key};
  return std::make_unique<EtcdClient>(eo);
}

// The address towards the first member with a route (the others' names may not resolve yet).
std::string EtcdBackend::reach() const {
  for (const auto& e : endpoints_) {
    auto a = source_address_towards(e.host);
    if (!a.empty()) return a;
  }
  return "";
}

std::unique_ptr<Connection> EtcdBackend::connect(std::chrono::milliseconds timeout) {
  names_.until(timeout);
  std::shared_ptr<EtcdClient> c = client(timeout);
  std::int64_t stray = 0;
  {
    // The first connection opens the session. A stop meanwhile (another thread: the agent's
    // shutdown, which gives up a rendezvous thread stuck on etcd after 2 s) ends its grant at once.
    std::lock_guard<std::mutex> lk(lease_mu_);
    if (lease_->id == 0) stray = start_lease(c);
  }
  if (stray != 0) {
    revoke(stray);
    throw Error("the etcd lease was given up as soon as granted: ddprun is stopping");
  }
  return std::make_unique<EtcdConnection>(std::move(c), prefix_, lease_);
}

// The keeper thread's loop (start_lease): `c` grants a new lease where the old one expired.
static void keep_lease(const std::shared_ptr<EtcdBackend::Lease>& lease, EtcdClient* c, EtcdLeaseKeeper* keeper,
                       const std::weak_ptr<Renewals>& renewals, std::chrono::seconds ttl) {
  const auto every = etcd_renewal_interval(ttl);
  auto counted = Clock::time_point::min();  // the latest time the lease counts from
  bool holding = false;                     // held by a leaderless majority (said once)
  std::int64_t renewing = lease->id;
  std::chrono::milliseconds retry = 20ms;  // doubled at each round that renewed nowhere
  auto count_from = [&](Clock::time_point t) {
    counted = std::max(counted, t);
    lease->renewed_at(counted);
    if (auto rn = renewals.lock()) rn->renewed(counted);
  };
  for (auto pause = every; !lease->stop.wait_for(pause);) {
    const std::int64_t id = lease->id;
    if (id != renewing) keeper->restart(lease->term);  // replaced by a write that found it expired
    renewing = id;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(lease->renewed() + ttl - fence_margin(ttl) - Clock::now());
    auto r = keeper->renew(id, etcd_renewal_patience(ttl, left));
    if (lease->stop.stopped()) break;  // (a renewal in flight at the end: nothing more, no new lease)
    // After a round that renewed nowhere, the next at once (20 ms), then twice as long each
    // time, up to the renewal interval: a cluster too loaded to answer in time is not sent
    // each node's renewal (and its who-leads questions) fifty times a second.
    retry = r.sent ? 20ms : std::min<std::chrono::milliseconds>(every, retry * 2);
    pause = r.sent ? every : retry / 2;
    if (r.sent) {
      count_from(*r.sent);
      holding = false;
    } else if (r.held) {
      if (!holding) {
        spdlog::info("ddprun: etcd has no leader (a majority of its members say so): this node's lease cannot expire "
                     "before the next leader extends it, so its workers go on");
      }
      holding = true;
      count_from(*r.held);
    } else if (r.expired) {
      try {
        lease->replace(*c, id);
        count_from(c->last_sent());
      } catch (const Error& e) {
        spdlog::debug("ddprun: a new etcd lease: {}", e.what());
      }
    } else {
      // No member renewed it this round: the next tries again at once; the fence stops this
      // node's workers if none gets through in time.
      spdlog::debug("ddprun: etcd keep-alive failed: {}", r.why);
    }
  }
}

// The lease is renewed every TTL/10 on a thread of its own, for the whole job: through the member
// that renewed it last, given etcd_renewal_patience(), then where that fails through the others at
// once, its request still waited for (EtcdLeaseKeeper), each given etcd_keepalive_attempt(); a
// stop ends a renewal under way at once. A round that got through
// nowhere is followed by another at once. A renewal counts from when the request that
// got through was sent. A round in which a majority of members said etcd has no leader (an
// election) counts from when that was asked: nobody can revoke the lease meanwhile, and the
// leader elected next extends it by its TTL (EtcdLeaseKeeper). A lease that expired anyway (the
// node was stopped, or cut off) is replaced: the others counted this node lost, and it joins
// again as a new node.
// A stop interrupts the granting client (at once where it came first: the grant is then not sent).
// A lease granted as a stop came is returned (the caller revokes it), and no keeper started.
std::int64_t EtcdBackend::start_lease(const std::shared_ptr<EtcdClient>& c) {
  lease_->stop.also_on_stop([c] { c->interrupt(); });
  const std::int64_t id = c->grant_lease(opt_.lease_ttl);
  std::lock_guard<std::mutex> lk(keeper_mu_);
  if (lease_->stop.stopped()) return id;
  lease_->ttl = opt_.lease_ttl;
  lease_->id = id;
  lease_->term = c->lease_term();
  lease_->renewed_at(c->last_sent());
  if (auto r = renewals_.lock()) r->renewed(c->last_sent());
  EtcdOptions each(endpoints_, etcd_keepalive_attempt(opt_.lease_ttl));
  each.user = opt_.etcd_user;
  each.password = opt_.etcd_password;
  each.tls = {opt_.etcd_cacert, opt_.etcd_cert, opt_.etcd_key};
  auto keeper = std::make_shared<EtcdLeaseKeeper>(each, c->lease_term());
  std::shared_ptr<EtcdClient> granting = client(opt_.lease_ttl);  // a new lease where it expired
  // A renewal or grant waiting on etcd ends at a stop.
  lease_->stop.also_on_stop([keeper, granting] {
    keeper->interrupt();
    granting->interrupt();
  });
  keeper_.start([lease = lease_, c = granting, keeper, renewals = renewals_, ttl = opt_.lease_ttl] {
    keep_lease(lease, c.get(), keeper.get(), renewals, ttl);
  });
  return 0;
}

// The stop first (it ends a grant under way), then the keeper's mutex: a keeper started before the
// stop is joined, none starts after it.
void EtcdBackend::stop_renewals() {
  lease_->stop.stop();
  std::lock_guard<std::mutex> lk(keeper_mu_);
  keeper_.join_within(1s);
}

void EtcdBackend::close() {
  stop_renewals();
  if (lease_->id != 0) revoke(lease_->id);
}

void EtcdBackend::revoke(std::int64_t lease) const {
  try {
    client(2s)->revoke(lease);
  } catch (const Error& e) {
    spdlog::debug("ddprun: revoking this node's etcd lease: {}", e.what());
  }
}

std::unique_ptr<Liveness> EtcdBackend::watch(const Members& m, std::weak_ptr<LivenessEvents> events) {
  auto w = std::make_shared<RecordWatch>();
  w->c = client(opt_.read_timeout);
  w->m = m;
  w->ttl = opt_.lease_ttl;
  w->give_up = opt_.read_timeout;
  w->prefix = prefix_;
  w->events = std::move(events);
  return std::make_unique<LivenessThread<RecordWatch>>(w, 1500ms);
}

}  // namespace ddprun::rounds
