#pragma once
// Renews one etcd lease through every member at once. A renewal sent to one member at a time
// waits out each member that cannot answer (paused, cut off, forwarding to a leader that is
// gone); sent to all at once, it gets through as soon as any member can serve it, so that the
// only time a renewal cannot be had is while etcd has no leader at all.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "etcd_client.hpp"

namespace ddprun::rounds {

class EtcdLeaseKeeper {
 public:
  using Clock = std::chrono::steady_clock;
  // `each`: the settings of one member's client (its endpoints are replaced by that member);
  // every renewal to a member is bounded by `each.timeout`.
  explicit EtcdLeaseKeeper(const EtcdOptions& each);

  struct Renewal {
    std::optional<Clock::time_point> sent;  // when the latest request that renewed it was sent
    bool expired = false;                   // a member said the lease is gone
    std::string why;                        // when neither: what the members said
  };
  // One keep-alive of `lease` to every member at once; returns when all have answered or timed out.
  Renewal renew(std::int64_t lease);

 private:
  std::vector<std::unique_ptr<EtcdClient>> members_;  // one each; used by one thread at a time
};

}  // namespace ddprun::rounds
