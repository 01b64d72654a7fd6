#pragma once
// The c10d rendezvous (and torchrun's static one): nodes meet through the rendezvous store,
// hosted by one of the agents. All of its store traffic runs off the agent's loop:
//   - the coordinator thread runs the requests in order (connect, join, end, success report,
//     acknowledgement) and, while a round runs, the keep-alives and the watch of the next node's
//     keep-alive (a ring: O(1) requests per node);
//   - the watch thread waits, on a connection of its own, for the round's end record;
//   - a stop during a rendezvous is announced from a thread of its own, since the coordinator
//     thread may be blocked in the rendezvous' WAIT.
// Results are posted to the loop. The threads share one state object with this one, so a thread
// left behind at exit (stuck on an unreachable store) touches nothing that is gone.

#include <cstdint>
#include <memory>
#include <string>

#include "ddprun/agent/agent.hpp"
#include "rendezvous.hpp"

namespace ddprun::agent {

class StoreRendezvous : public Rendezvous {
 public:
  // Hosts the rendezvous store when this node is the host (binding only). Throws ddprun::Error.
  StoreRendezvous(const RendezvousOptions& opt, const std::string& run_id, int nproc, int node_rank, Post post);
  ~StoreRendezvous() override;

  bool is_host() const;
  // The rendezvous store's address, with the real port once this node hosts it on port 0.
  std::string endpoint() const;
  std::uint16_t endpoint_port() const;

  void set_listener(Listener& l) override;
  std::string describe() const override;
  void join(int round, int restart_count) override;
  void end_round(int round, const RoundEnd& why, int expect_next) override;
  void report_success(int round) override;
  void finish(int round, bool acknowledge) override;
  void leave(int round, int signal) override;
  void shutdown() override;

 private:
  struct Core;
  std::shared_ptr<Core> core_;
};

}  // namespace ddprun::agent
