#pragma once
// A small, blocking client of etcd's v3 API through its JSON gateway (HTTP/1.1 over Boost.Beast):
// the key-value operations, transactions for create-if-absent, leases, and watches. Every call is
// bounded by the time-out; a member that cannot be reached is skipped for the next one, so a
// cluster that loses any one member (its leader included) keeps serving. The foundation of the
// etcd rendezvous backend.
//
// Fail-over: a member that is paused (SIGSTOP, a disk stall), cut off, or without a leader keeps
// a request unanswered for seconds (etcd's own time-out), yet accepts its connection. Each
// member is therefore given `attempt` to answer before the next one is tried, and watches are
// made with etcd's require-leader flag, so that they move off a member that lost its leader.
//
// Why the JSON gateway rather than gRPC: no generated code, no protobuf or gRPC build
// dependency, one header-only library (Beast) that ddprun already has; the rendezvous needs a
// handful of small requests per round, where the gateway's cost does not matter.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::rounds {

struct EtcdEndpoint {
  std::string host;
  std::uint16_t port = 2379;
  bool tls = false;  // https://: the member's certificate is checked against EtcdTls::cacert
};

// TLS to etcd, with etcdctl's names (--cacert, --cert, --key): PEM files. No cacert: plain HTTP.
struct EtcdTls {
  std::string cacert;     // the CA that signed the members' server certificates
  std::string cert, key;  // this node's client certificate and key (etcd --client-cert-auth); both or neither
  bool enabled() const { return !cacert.empty(); }
};

struct EtcdOptions {
  EtcdOptions() = default;
  EtcdOptions(std::vector<EtcdEndpoint> e, std::chrono::milliseconds t) : endpoints(std::move(e)), timeout(t) {}
  std::vector<EtcdEndpoint> endpoints;
  std::chrono::milliseconds timeout{std::chrono::seconds(5)};  // per call, all members tried
  // One member's time to answer before the next is tried; twice that each time round the
  // members again, up to a third of `timeout` (the most, and the default when 0).
  std::chrono::milliseconds attempt{0};
  std::string user, password;                                  // when the cluster has auth on
  EtcdTls tls;                                                 // used by the endpoints with tls set
};

struct EtcdKv {
  std::string key, value;
  std::int64_t create_revision = 0, mod_revision = 0, lease = 0;
  std::int64_t version = 0;  // puts since it was created (1: only the first)
};

struct EtcdEvent {
  bool deleted = false;  // else a put
  EtcdKv kv;
};

// "h1:2379,https://h2:2379,[::1]:2379" -> endpoints, as etcdctl writes them: http:// or https://
// choose TLS; an endpoint without a scheme uses TLS when `tls_default`. Throws UsageError.
std::vector<EtcdEndpoint> parse_etcd_endpoints(const std::string& list, bool tls_default = false);

// Throws UsageError when the endpoints' schemes and the TLS files do not fit together (https://
// without cacert, http:// with it, cert without key) or a file cannot be loaded.
void check_etcd_tls(const std::vector<EtcdEndpoint>& endpoints, const EtcdTls& tls);

class EtcdClient {
 public:
  explicit EtcdClient(EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  std::optional<EtcdKv> get(const std::string& key);
  // Every key under `prefix`, in creation order.
  std::vector<EtcdKv> get_prefix(const std::string& prefix);
  std::int64_t put(const std::string& key, const std::string& value, std::int64_t lease = 0);
  // Puts each key with its value, in order, in transactions of up to kTxnPuts puts (etcd's
  // --max-txn-ops is 128 by default): one request for up to that many keys.
  static constexpr std::size_t kTxnPuts = 128;
  void put_all(const std::vector<std::string>& keys, const std::vector<std::string>& values, std::int64_t lease = 0);
  // Creates `key` unless it exists (one transaction): true when this call created it; else
  // `existing` (when given) receives the current entry. A member that timed out may have applied
  // the transaction before the retry on another: make values unique (a node id) and compare.
  bool create(const std::string& key, const std::string& value, std::int64_t lease = 0, EtcdKv* existing = nullptr);
  // Replaces `key`'s value if it was last modified at `mod_revision` (one transaction): true
  // when this call replaced it. The building block of counters (read, then replace).
  bool replace(const std::string& key, const std::string& value, std::int64_t mod_revision);
  std::int64_t delete_prefix(const std::string& prefix);

  // A counter at `key` that takes no retries under contention (etcd has no atomic add; a
  // compare-and-swap counter costs up to K^2 transactions when K nodes add at once). Each add
  // is one transaction that puts `key` (its version, which etcd raises by one per put, orders the
  // adds), puts a mark `key`/+1/`token` (delta 1) or `key`/d/`token` (any other delta, as its
  // value), and reads back `key` and the d/ marks: the counter is the version plus the sum of
  // (delta - 1) over the d/ marks. The mark makes it idempotent: the same `token` again (a
  // member that applied the transaction but answered too late) reads back the counter as of
  // that transaction, not a second add. Returns the counter after this add.
  std::int64_t counter_add(const std::string& key, std::int64_t delta, const std::string& token);
  // The counter at `key` as counter_add() keeps it (absent: 0): one read-only transaction.
  std::int64_t counter(const std::string& key);

  std::int64_t grant_lease(std::chrono::seconds ttl);
  // Renews `lease`; false when it has expired already. `patient` (over 0): the call is given that
  // long, as one attempt on the first member, in place of the options' time-out and attempts; a
  // refusal or a broken connection ends it at once.
  bool keep_alive(std::int64_t lease, std::chrono::milliseconds patient = std::chrono::milliseconds::zero());
  void revoke(std::int64_t lease);

  // The events on `key` (or every key under it, `prefix`) from revision `from` on; waits up to
  // `limit` for the first one, then returns what arrived with it (empty: none in time). A member
  // that does not confirm the watch within `attempt`, has no leader, or whose stream breaks is
  // left for the next one, where the watch starts again from `from`: no event is lost.
  // `quiet` (when given) is set when a member held the watch to the limit with no event: the
  // caller may watch again from `from` without reading the key (else it was cancelled, a
  // compacted revision or an interrupt(), or no member served it: read the state anew).
  std::vector<EtcdEvent> watch(const std::string& key, bool prefix, std::int64_t from, std::chrono::milliseconds limit,
                               bool* quiet = nullptr);
  // Ends the watch running now on another thread within moments (as if its limit had come; a
  // member being connected to gets its attempt first), and every later watch; a request waiting
  // for its answer, and every later one, ends with an Error. For a thread that holds a watch or
  // a patient request long and must stop within a bound. Thread-safe.
  void interrupt();

  // The member that answered, the cluster's leader as that member knows it ("0": none), as
  // etcd ids, and that member's raft term. Served by the member alone, leader or not.
  struct Status {
    std::string member_id, leader_id;
    std::int64_t raft_term = 0;
  };
  Status status();
  // How many voting members the cluster has, as the member that answered knows it.
  std::size_t voting_members();

  // When the request that the last answer replied to was sent (its attempt's, not the call's
  // start): etcd applied it after that. A lease renewed by keep_alive() lasts its TTL from then.
  std::chrono::steady_clock::time_point last_sent() const;

  // The store's revision as of the last response.
  std::int64_t revision() const { return revision_; }
  // The raft term of the last lease grant or renewal (0: none yet).
  std::int64_t lease_term() const { return lease_term_; }

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  std::int64_t revision_ = 0;
  std::int64_t lease_term_ = 0;
};

}  // namespace ddprun::rounds
