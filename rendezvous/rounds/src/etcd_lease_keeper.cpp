#include "etcd_lease_keeper.hpp"

#include <future>

#include "ddprun/common/error.hpp"

namespace ddprun::rounds {

EtcdLeaseKeeper::EtcdLeaseKeeper(const EtcdOptions& each) {
  for (const auto& e : each.endpoints) {
    EtcdOptions one = each;
    one.endpoints = {e};
    members_.push_back(std::make_unique<EtcdClient>(one));
  }
}

EtcdLeaseKeeper::Renewal EtcdLeaseKeeper::renew(std::int64_t lease) {
  struct One {
    std::optional<Clock::time_point> sent;
    bool expired = false;
    std::string why;
  };
  std::vector<std::future<One>> calls;
  for (auto& m : members_) {
    calls.push_back(std::async(std::launch::async, [&c = *m, lease] {
      One r;
      try {
        if (c.keep_alive(lease)) {
          r.sent = c.last_sent();
        } else {
          r.expired = true;
        }
      } catch (const Error& e) {
        r.why = e.what();
      }
      return r;
    }));
  }
  Renewal out;
  for (auto& f : calls) {
    One r = f.get();
    if (r.sent && (!out.sent || *r.sent > *out.sent)) out.sent = r.sent;
    out.expired = out.expired || r.expired;
    if (!r.why.empty()) out.why += (out.why.empty() ? "" : "; ") + r.why;
  }
  if (out.sent) out.expired = false;  // a member that answered for it is right: it is alive
  return out;
}

}  // namespace ddprun::rounds
