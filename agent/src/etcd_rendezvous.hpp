#pragma once
// The etcd rendezvous (--rdzv_backend=etcd): nodes meet through an etcd v3 cluster, so no node is
// a single point of failure. Same semantics as c10d (rounds, MIN:MAX, last call, one global
// restart count, membership changes), built on etcd's primitives:
//   <prefix>/<run_id>/round              the latest round
//   .../r<R>/join/<node id>              NodeInfo, on the node's lease: arrival order = creation
//                                        revision; a node that dies loses its key when its lease
//                                        expires, which every other node sees through its watch
//   .../r<R>/closed                      the members (node ids, in order), created once (txn)
//   .../r<R>/rc, expect, store, end      restart count, next round's size, the workers' store
//                                        (hosted by group rank 0), why the round ended (txn)
//   .../r<R>/succeeded/<id>, acked/<id>  success and end acknowledgements; the last node to
//                                        acknowledge deletes the run's keys, leaving only
//   <prefix>/<run_id>/finished           on a 10-minute lease: a late node is told the job ended
// Threads: requests in order on a coordinator thread, the round's watch on another, the lease's
// keep-alive on a third, a stop announcement on its own; results posted to the loop.

#include <memory>
#include <string>

#include "ddprun/agent/agent.hpp"
#include "rendezvous.hpp"

namespace ddprun::agent {

class EtcdRendezvous : public Rendezvous {
 public:
  // Throws UsageError for a malformed endpoint list.
  EtcdRendezvous(const RendezvousOptions& opt, const std::string& run_id, int nproc, Post post);
  ~EtcdRendezvous() override;

  void set_listener(Listener& l) override;
  std::string describe() const override;
  void join(int round, int restart_count) override;
  void end_round(int round, const RoundEnd& why, int expect_next) override;
  void report_success(int round) override;
  void finish(int round, bool acknowledge) override;
  void leave(int round, int signal) override;
  void shutdown() override;

  struct Core;

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace ddprun::agent
