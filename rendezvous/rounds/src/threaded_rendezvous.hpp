#pragma once
// The multi-node Rendezvous: the round rules over a backend (a c10d store or etcd), run off the
// caller's loop:
//   - the coordinator thread runs the requests in order (connect, join, end, success report,
//     acknowledgement) and owns the round's liveness watch (backend.hpp);
//   - the watch thread waits, on a connection of its own, for the round's end record;
//   - a stop during a rendezvous is announced from a thread of its own, since the coordinator
//     thread may be blocked in the rendezvous' wait.
// Results are posted to the loop. The threads share one state object with this one, so a thread
// left behind at exit (stuck on an unreachable backend) touches nothing that is gone.
//
// Self-fencing: every renewal of this node's liveness moves the Fence's deadline to
// renewal + TTL - margin, before the other nodes may count this node lost (renewal + TTL).

#include <functional>
#include <memory>
#include <string>

#include "backend.hpp"
#include "ddprun/rounds/rendezvous.hpp"

namespace ddprun::rounds {

class ThreadedRendezvous : public Rendezvous {
 public:
  // The backend is built with the rendezvous' renewal sink. Throws what the factory throws.
  using BackendFactory = std::function<std::unique_ptr<Backend>(std::weak_ptr<Renewals>)>;
  ThreadedRendezvous(const RendezvousOptions& opt, const BackendFactory& make_backend, Post post, Fence* fence);
  ~ThreadedRendezvous() override;

  Backend& backend();

  void set_listener(Listener& l) override;
  std::string describe() const override;
  void join(int round, int restart_count, const Streak& streak = {}, const StateOffer& state = {}) override;
  void end_round(int round, const RoundEnd& why, int expect_next) override;
  void report_success(int round) override;
  void finish(int round, Ack ack) override;
  void leave(int round, int signal) override;
  void shutdown() override;
  std::vector<HostedStore> hosted_stores() const override;

 private:
  struct Core;
  std::shared_ptr<Core> core_;
};

// How long before the others may count this node lost its workers are stopped: a quarter of
// the TTL, at most 2 s.
std::chrono::milliseconds fence_margin(std::chrono::milliseconds ttl);

}  // namespace ddprun::rounds
