#pragma once
// Renews one etcd lease through the member that renewed it last, and, where that one does not
// within its patience, through the other members at once, its request still waited for. A
// renewal sent to one member at a time waits out each member that cannot answer (paused, cut
// off, forwarding to a leader that is gone); sent to the others as well, it gets through as soon
// as any member can serve it, so that the only time a renewal cannot be had is while etcd has no
// leader at all. A request is not given up while the renewal waits: on an etcd that is only
// behind, each one sent again would add to the work it is behind with.
//
// While etcd has no leader, nobody can revoke the lease either: a revocation is a proposal that a
// leader commits through a majority, and a newly elected leader first extends every lease by its
// full TTL (plus its election timeout: etcd's lessor Promote). So a round that renewed nowhere,
// but in which a majority of the cluster's members each said it has no leader, at the raft term
// the lease was last renewed in or a later one, holds the lease as a renewal would (the rule:
// leaderless_quorum; why it is safe: docs/multi-node.md, "etcd outages"). A node cut off from
// the majority cannot hear a majority, so it fences in time as before.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "etcd_client.hpp"

namespace ddprun::rounds {

// One member's answer to "who leads?" after it could not renew the lease.
struct LeaderlessAnswer {
  std::string member_id;
  bool leaderless = false;  // it has no leader now
  std::int64_t term = 0;    // its raft term
  std::chrono::steady_clock::time_point sent;  // when the question was sent
};
// When a majority of `voting_members` (distinct ids) answered leaderless at `renewed_term` or
// later (a member behind it is lagging, and counts for nothing): the earliest of their questions' send times, from which the lease is as good as
// renewed (no leader that can still commit was elected before it). Otherwise none.
std::optional<std::chrono::steady_clock::time_point> leaderless_quorum(const std::vector<LeaderlessAnswer>& answers,
                                                                       std::size_t voting_members,
                                                                       std::int64_t renewed_term);

// One member's part in a round of renewals.
struct MemberRenewal {
  std::optional<std::chrono::steady_clock::time_point> sent;  // renewed: when the request was sent
  std::int64_t term = 0;                                      // the raft term it renewed in
  bool expired = false;                                       // it said the lease is gone
  std::optional<LeaderlessAnswer> asked;  // it could not renew: who leads, as it knows it
  std::size_t voting = 0;                 // the voting members it listed (when asked)
  std::string why;
};

class EtcdLeaseKeeper {
 public:
  using Clock = std::chrono::steady_clock;
  // `each`: the settings of one member's client (its endpoints are replaced by that member);
  // every renewal to a member is bounded by `each.timeout`. `renewed_term`: the raft term the
  // lease was granted in.
  EtcdLeaseKeeper(const EtcdOptions& each, std::int64_t renewed_term);

  struct Renewal {
    std::optional<Clock::time_point> sent;  // when the latest request that renewed it was sent
    std::optional<Clock::time_point> held;  // else: a majority said etcd has no leader (leaderless_quorum)
    bool expired = false;                   // a member said the lease is gone
    std::string why;                        // when none of these: what the members said
  };
  // One keep-alive of `lease` to the member that renewed it last, given `patience` (at least
  // `each.timeout`) to answer alone; where it has not, to the other members at once, each given
  // `each.timeout`, while its request is waited for as long again (where it answered without
  // renewing, refused or broke the connection, it is asked again with them); returning when all
  // have answered or timed out, each member that did not renew asked who leads.
  Renewal renew(std::int64_t lease, std::chrono::milliseconds patience = std::chrono::milliseconds::zero());
  // Ends the renewal under way within moments, unrenewed, and every later one (a stop).
  // Thread-safe.
  void interrupt();
  // A new lease, granted in `term`.
  void restart(std::int64_t term) { renewed_term_ = term; }
  // The member (its index in `each.endpoints`) that renewed it last, asked alone first.
  std::size_t preferred() const { return preferred_; }

 private:
  Renewal gather(std::vector<std::future<MemberRenewal>>& calls, std::size_t kept, const std::string& first_why);

  std::vector<std::unique_ptr<EtcdClient>> members_;  // one each; used by one thread at a time
  std::chrono::milliseconds attempt_;                 // each.timeout
  std::atomic<bool> interrupted_{false};
  std::int64_t renewed_term_;
  std::size_t voting_ = 0;  // the most voting members any member listed
  std::size_t preferred_ = 0;  // the member that renewed it last: asked alone first
};

}  // namespace ddprun::rounds
