#include "etcd_lease_keeper.hpp"

#include <algorithm>
#include <future>
#include <system_error>
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

// One keep-alive through one member (`patient`: its time, else the client's); true when it
// answered (renewed, or said the lease is gone).
bool keep_alive(EtcdClient& c, std::int64_t lease, std::chrono::milliseconds patient, MemberRenewal& r) {
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
void ask_who_leads(EtcdClient& c, MemberRenewal& r) {
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
  auto renewed = [this](const MemberRenewal& r) {
    renewed_term_ = std::max(renewed_term_, r.term);
    Renewal out;
    out.sent = r.sent;
    return out;
  };
  std::vector<std::future<MemberRenewal>> calls(members_.size());
  std::size_t kept = members_.size();  // the preferred, its request in flight as the others are asked
  std::string first_why;               // what it said within its patience, where it did not renew
  if (preferred_ < members_.size()) {
    auto& c = *members_[preferred_];
    auto& first = calls[preferred_];
    try {
      first = std::async(std::launch::async, [&c, lease, limit = patience + attempt_] {
        MemberRenewal r;
        keep_alive(c, lease, limit, r);
        return r;
      });
    } catch (const std::system_error&) {  // no thread to be had: the preferred alone, as it was
      MemberRenewal r;
      keep_alive(c, lease, patience, r);
      if (r.sent) return renewed(r);
      first_why = r.expired ? "the lease is gone" : r.why;
    }
    if (first.valid() && first.wait_for(patience) == std::future_status::ready) {
      MemberRenewal r = first.get();
      if (r.sent) return renewed(r);
      first_why = r.expired ? "the lease is gone" : r.why;
    } else if (first.valid()) {
      kept = preferred_;
    }
    if (!first_why.empty()) first_why = "(at first) " + first_why;
  }
  for (std::size_t i = 0; i < members_.size() && !interrupted_; ++i) {
    if (calls[i].valid()) continue;
    auto ask = [&c = *members_[i], lease] {
      MemberRenewal r;
      if (!keep_alive(c, lease, std::chrono::milliseconds::zero(), r)) ask_who_leads(c, r);
      return r;
    };
    try {
      calls[i] = std::async(std::launch::async, ask);
    } catch (const std::system_error&) {  // no thread to be had: this member asked here, in turn
      std::promise<MemberRenewal> now;
      now.set_value(ask());
      calls[i] = now.get_future();
    }
  }
  return gather(calls, kept, first_why);
}

// Every member's answer in turn: the latest renewal counts (its member asked first next time);
// else a member that said the lease is gone; else a leaderless majority, if any.
EtcdLeaseKeeper::Renewal EtcdLeaseKeeper::gather(std::vector<std::future<MemberRenewal>>& calls, std::size_t kept,
                                                 const std::string& first_why) {
  Renewal out;
  std::vector<LeaderlessAnswer> answers;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (!calls[i].valid()) continue;
    MemberRenewal r = calls[i].get();
    // The preferred, its request still in flight when the others were asked: asked who leads now.
    if (i == kept && !r.sent && !r.expired && !interrupted_) ask_who_leads(*members_[i], r);
    if (r.sent && (!out.sent || *r.sent > *out.sent)) out.sent = r.sent, preferred_ = i;
    if (r.sent) renewed_term_ = std::max(renewed_term_, r.term);
    out.expired = out.expired || r.expired;
    if (r.asked) answers.push_back(*r.asked);
    voting_ = std::max({voting_, r.voting, members_.size()});
    if (!r.why.empty()) out.why += (out.why.empty() ? "" : "; ") + r.why;
  }
  if (interrupted_) return {};
  if (!first_why.empty()) out.why = first_why + (out.why.empty() ? "" : "; " + out.why);
  if (out.sent) {
    out.expired = false;  // a member that answered for it is right: it is alive
  } else if (!out.expired) {
    out.held = leaderless_quorum(answers, voting_, renewed_term_);
  }
  return out;
}

}  // namespace ddprun::rounds
