#pragma once
// Whether this node's liveness lapsed, so that its guardian stopped its workers (docs:
// Self-fencing). Kept by the guardian's side of the agent (GuardianFence), read by the controller.

namespace ddprun::agent {

class FenceState {
 public:
  virtual ~FenceState() = default;
  // A lapse since reset(): workers SIGKILLed since were fenced, not failed.
  virtual bool lapsed() = 0;
  virtual void reset() = 0;  // a new group starts
  // Seconds since this node's last renewal of its liveness (the last sign of life the other
  // nodes had from it); 0 before the first.
  virtual double silent_s() = 0;
};

}  // namespace ddprun::agent
