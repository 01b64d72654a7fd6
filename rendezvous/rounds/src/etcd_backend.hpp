#pragma once
// The round records in an etcd v3 cluster (--rdzv_backend=etcd): keys under
// <prefix>/<run_id>/, first-writer-wins through transactions, counters through compare-and-swap,
// waits through watches. Each node holds one lease for the job, renewed every TTL/10 (through the member that renewed it last, else the others as well); its node
// records live on it, so a node that dies loses them when its lease expires, which every other
// member of its round sees through a watch. No node holds the records: the cluster does.
//
// Losing one member of three (killed, paused, cut off, restarted, or a leader election) costs a
// job nothing: each request moves to another member within etcd_attempt(); losing the quorum for
// longer than the fence allows fences every node (README: etcd outages).

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend.hpp"
#include "bounded_thread.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/rounds/options.hpp"
#include "etcd_client.hpp"
#include "name_wait.hpp"
#include "task_queue.hpp"

namespace ddprun::rounds {

// How long one member has to answer a request before the next is tried: half the fence's margin
// (625 ms of a 5 s lease TTL), at least 100 ms.
std::chrono::milliseconds etcd_attempt(std::chrono::milliseconds ttl);
// How long one member has to renew the lease (all are asked at once): half etcd_attempt().
std::chrono::milliseconds etcd_keepalive_attempt(std::chrono::milliseconds ttl);
// How often the lease is renewed: TTL/10, at least 100 ms.
std::chrono::milliseconds etcd_renewal_interval(std::chrono::milliseconds ttl);
// How long the member that renewed the lease last is given to renew it again, alone, before the
// others are asked: half of what is left before the fence (`left`) beyond two rounds of asking
// every member, at least etcd_keepalive_attempt(). A slow etcd is then sent one renewal a node
// rather than one per member and a question of who leads, and a paused member still leaves the
// others their time. (A stop interrupts a renewal under way: EtcdLeaseKeeper::interrupt.)
std::chrono::milliseconds etcd_renewal_patience(std::chrono::milliseconds ttl, std::chrono::milliseconds left);

class EtcdBackend : public Backend {
 public:
  // Throws UsageError for a malformed endpoint list.
  EtcdBackend(const RendezvousOptions& opt, std::weak_ptr<Renewals> renewals);
  ~EtcdBackend() override;

  std::string where() const override { return "etcd at " + opt_.etcd_endpoints; }
  // Waits (within `timeout`) for one member's name to resolve first.
  std::unique_ptr<Connection> connect(std::chrono::milliseconds timeout) override;
  void close() override;
  void stop_renewals() override;
  std::string reach() const override;
  bool holds_records() const override { return false; }
  std::chrono::milliseconds liveness_ttl() const override { return opt_.lease_ttl; }
  std::chrono::milliseconds outage_tolerance() const override { return opt_.read_timeout; }
  std::string lost_hint() const override {
    return "no member answered for " + duration_text(opt_.read_timeout) + " (read_timeout)";
  }
  std::string unanswered_hint() const override {
    return "where etcd or this machine is overloaded, a larger --rdzv_conf lease_ttl gives each request longer (it gets "
           "lease_ttl, at least 2 s)";
  }
  std::unique_ptr<Liveness> watch(const Members& m, std::weak_ptr<LivenessEvents> events) override;
  bool members_silent(Connection& c, int round, int members, std::vector<long long>&) override {
    return records_gone(c, round, members);
  }

  // This node's lease, shared with its connections and its keeper thread.
  struct Lease {
    std::atomic<std::int64_t> id{0};
    std::atomic<std::int64_t> term{0};  // the raft term it was granted in
    std::chrono::seconds ttl{5};
    // When the latest renewal that counts was sent (steady clock, ns): how long this node went
    // unheard, for the message when the lease expired anyway, and how long is left before the fence.
    std::atomic<std::int64_t> renewed_ns{0};
    Clock::time_point renewed() const { return Clock::time_point(std::chrono::nanoseconds(renewed_ns.load())); }
    void renewed_at(Clock::time_point t) {
      renewed_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
    }
    StopSignal stop;  // the keeper's pause, cut short at the end
    std::mutex mu;    // one replacement at a time
    // A new lease through `c` in place of `stale`, which etcd no longer has (it expired): once,
    // whichever thread finds it first (the keeper, or a write on it). Returns the lease now held.
    std::int64_t replace(EtcdClient& c, std::int64_t stale);
  };

 private:
  std::unique_ptr<EtcdClient> client(std::chrono::milliseconds timeout) const;
  std::int64_t start_lease(const std::shared_ptr<EtcdClient>& c);
  void revoke(std::int64_t lease) const;  // best effort, 2 s

  RendezvousOptions opt_;
  std::vector<EtcdEndpoint> endpoints_;
  NameWait names_;
  std::string prefix_;
  std::weak_ptr<Renewals> renewals_;
  std::mutex lease_mu_;   // the first connect opens the lease, once
  std::mutex keeper_mu_;  // the keeper starts before a stop, or not at all
  std::shared_ptr<Lease> lease_ = std::make_shared<Lease>();
  BoundedThread keeper_;
};

}  // namespace ddprun::rounds
