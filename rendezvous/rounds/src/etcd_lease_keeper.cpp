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

EtcdLeaseKeeper::EtcdLeaseKeeper(const EtcdOptions& each, std::int64_t renewed_term) : renewed_term_(renewed_term) {
  for (const auto& e : each.endpoints) {
    EtcdOptions one = each;
    one.endpoints = {e};
    members_.push_back(std::make_unique<EtcdClient>(one));
  }
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

// Renews through one member; where that fails, asks the member whether it has a leader (served
// by the member alone) and how many voting members the cluster has.
One renew_through(EtcdClient& c, std::int64_t lease) {
  One r;
  try {
    if (c.keep_alive(lease)) {
      r.sent = c.last_sent();
      r.term = c.lease_term();
    } else {
      r.expired = true;
    }
    return r;
  } catch (const Error& e) {
    r.why = e.what();
  }
  try {
    auto s = c.status();
    const auto sent = c.last_sent();
    r.why += " (member " + s.member_id + " at term " + std::to_string(s.raft_term) + ", leader " + s.leader_id + ")";
    if (s.leader_id != "0" && !s.leader_id.empty()) return r;  // it has a leader, that did not renew in time
    r.voting = c.voting_members();
    r.asked = LeaderlessAnswer{s.member_id, true, s.raft_term, sent};
  } catch (const Error& e) {
    r.why += std::string(" (who leads: ") + e.what() + ")";  // paused or cut off: nothing that counts
  }
  return r;
}

}  // namespace

EtcdLeaseKeeper::Renewal EtcdLeaseKeeper::renew(std::int64_t lease, std::chrono::milliseconds patience,
                                                const std::function<bool()>& stopped) {
  // The member that renewed it last, alone first: one request a renewal while it serves (each
  // member forwards a renewal to the leader, so asking all three costs etcd three). Where it
  // does not renew it within `patience`, every member at once, as below.
  if (preferred_ < members_.size()) {
    auto& c = *members_[preferred_];
    try {
      if (c.keep_alive(lease, patience)) {
        renewed_term_ = std::max(renewed_term_, c.lease_term());
        Renewal out;
        out.sent = c.last_sent();
        return out;
      }
    } catch (const Error&) {
    }
  }
  if (stopped && stopped()) return {};
  std::vector<std::future<One>> calls;
  for (auto& m : members_) {
    calls.push_back(std::async(std::launch::async, [&c = *m, lease] { return renew_through(c, lease); }));
  }
  Renewal out;
  std::vector<LeaderlessAnswer> answers;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    One r = calls[i].get();
    if (r.sent && (!out.sent || *r.sent > *out.sent)) out.sent = r.sent, preferred_ = i;
    if (r.sent) renewed_term_ = std::max(renewed_term_, r.term);
    out.expired = out.expired || r.expired;
    if (r.asked) answers.push_back(*r.asked);
    voting_ = std::max({voting_, r.voting, members_.size()});
    if (!r.why.empty()) out.why += (out.why.empty() ? "" : "; ") + r.why;
  }
  if (out.sent) {
    out.expired = false;  // a member that answered for it is right: it is alive
  } else if (!out.expired) {
    out.held = leaderless_quorum(answers, voting_, renewed_term_);
  }
  return out;
}

}  // namespace ddprun::rounds
