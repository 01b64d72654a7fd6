#include "etcd_lease_keeper.hpp"

#include <algorithm>
#include <future>
#include <set>

#include "ddprun/common/error.hpp"

namespace ddprun::rounds {

std::optional<std::chrono::steady_clock::time_point> leaderless_quorum(const std::vector<LeaderlessAnswer>& answers,
                                                                       std::size_t voting_members,
                                                                       std::int64_t renewed_term) {
  std::set<std::string> counted;
  std::optional<std::chrono::steady_clock::time_point> earliest;
  for (const auto& a : answers) {
    if (!a.leaderless || a.term < renewed_term || a.member_id.empty() || !counted.insert(a.member_id).second) continue;
    if (!earliest || a.sent < *earliest) earliest = a.sent;
  }
  if (voting_members == 0 || counted.size() < voting_members / 2 + 1) return std::nullopt;
  return earliest;
}

EtcdLeaseKeeper::EtcdLeaseKeeper(const EtcdOptions& each, std::int64_t renewed_term)
    : attempt_(each.timeout), renewed_term_(renewed_term) {
  for (const auto& e : each.endpoints) {
    EtcdOptions one = each;
    one.endpoints = {e};
    members_.push_back(std::make_unique<EtcdClient>(one));
  }
}

void EtcdLeaseKeeper::interrupt() {
  interrupted_ = true;
  for (auto& m : members_) m->interrupt();
}

namespace {

struct One {
  std::optional<std::chrono::steady_clock::time_point> sent;
  std::int64_t term = 0;
  bool expired = false;
  std::optional<LeaderlessAnswer> asked;  // it could not renew: who leads, as it knows it
  std::size_t voting = 0;
  std::string why;
};

// One keep-alive through one member (`patient`: its time, else the client's); true when it
// answered (renewed, or said the lease is gone).
bool keep_alive(EtcdClient& c, std::int64_t lease, std::chrono::milliseconds patient, One& r) {
  try {
    if (c.keep_alive(lease, patient)) {
      r.sent = c.last_sent();
      r.term = c.lease_term();
    } else {
      r.expired = true;
    }
    return true;
  } catch (const Error& e) {
    r.why = e.what();
    return false;
  }
}

// After a member did not renew: asks it whether it has a leader (served by the member alone)
// and how many voting members the cluster has.
void ask_who_leads(EtcdClient& c, One& r) {
  try {
    auto s = c.status();
    const auto sent = c.last_sent();
    r.why += " (member " + s.member_id + " at term " + std::to_string(s.raft_term) + ", leader " + s.leader_id + ")";
    if (s.leader_id != "0" && !s.leader_id.empty()) return;  // it has a leader, that did not renew in time
    r.voting = c.voting_members();
    r.asked = LeaderlessAnswer{s.member_id, true, s.raft_term, sent};
  } catch (const Error& e) {
    r.why += std::string(" (who leads: ") + e.what() + ")";  // paused or cut off: nothing that counts
  }
}

}  // namespace

EtcdLeaseKeeper::Renewal EtcdLeaseKeeper::renew(std::int64_t lease, std::chrono::milliseconds patience) {
  // The member that renewed it last, alone first: one request a renewal while it serves (each
  // member forwards a renewal to the leader, so asking all three costs etcd three). Where it has
  // not answered within `patience`, its request stays in flight, one attempt longer, while the
  // other members are asked: a slow etcd is sent three requests for the renewal, not four (and
  // its late answer counts, from when it was sent). Where it answered otherwise within its
  // patience (refused, broke the connection, or said the lease is gone), it is asked again with
  // the others.
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::future<One>> calls(members_.size());
  if (preferred_ < members_.size()) {
    auto& first = calls[preferred_];
    first = std::async(std::launch::async, [&c = *members_[preferred_], lease, patience, start, limit = patience + attempt_] {
      One r;
      if (!keep_alive(c, lease, limit, r) && std::chrono::steady_clock::now() - start >= patience) ask_who_leads(c, r);
      return r;
    });
    if (first.wait_for(patience) == std::future_status::ready) {
      One r = first.get();
      if (r.sent) {
        renewed_term_ = std::max(renewed_term_, r.term);
        Renewal out;
        out.sent = r.sent;
        return out;
      }
    }
    if (interrupted_) return {};
  }
  for (std::size_t i = 0; i < members_.size() && !interrupted_; ++i) {
    if (calls[i].valid()) continue;
    calls[i] = std::async(std::launch::async, [&c = *members_[i], lease] {
      One r;
      if (!keep_alive(c, lease, std::chrono::milliseconds::zero(), r)) ask_who_leads(c, r);
      return r;
    });
  }
  Renewal out;
  std::vector<LeaderlessAnswer> answers;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (!calls[i].valid()) continue;
    One r = calls[i].get();
    if (r.sent && (!out.sent || *r.sent > *out.sent)) out.sent = r.sent, preferred_ = i;
    if (r.sent) renewed_term_ = std::max(renewed_term_, r.term);
    out.expired = out.expired || r.expired;
    if (r.asked) answers.push_back(*r.asked);
    voting_ = std::max({voting_, r.voting, members_.size()});
    if (!r.why.empty()) out.why += (out.why.empty() ? "" : "; ") + r.why;
  }
  if (interrupted_) return {};
  if (out.sent) {
    out.expired = false;  // a member that answered for it is right: it is alive
  } else if (!out.expired) {
    out.held = leaderless_quorum(answers, voting_, renewed_term_);
  }
  return out;
}

}  // namespace ddprun::rounds
