#pragma once
// The rendezvous of a single node: every round is ready at once, and this node alone decides
// how it ends. It hosts the workers' store (TCPStore for PyTorch), emptied for every round.

#include <memory>
#include <set>

#include "ddprun/rounds/rendezvous.hpp"

namespace ddprun::rendezvous {
class StoreServer;
}

namespace ddprun::rounds {

class LocalRendezvous : public Rendezvous {
 public:
  // Binds the workers' store at opt.store_host:opt.store_port. Throws ddprun::Error (the
  // address is in use: what to do).
  LocalRendezvous(const RendezvousOptions& opt, Post post, WhenReadable when_readable = {});
  ~LocalRendezvous() override;

  void set_listener(Listener& l) override { listener_ = &l; }
  std::string describe() const override { return ""; }
  void join(int round, int restart_count, const Streak& streak = {}, const StateOffer& state = {}) override;
  void end_round(int round, const RoundEnd& why, int expect_next) override;
  void report_success(int round) override;
  void finish(int round, Ack ack) override;
  void leave(int round, int signal) override;
  void shutdown() override;
  std::vector<HostedStore> hosted_stores() const override;

 private:
  void over(int round, RoundEnd why);

  std::unique_ptr<rendezvous::StoreServer> store_;
  std::string host_;
  int nproc_;
  std::string node_name_;
  Post post_;
  WhenReadable when_readable_;
  bool serving_ = false;  // the store's start is arranged
  Listener* listener_ = nullptr;
  std::set<int> ended_;  // rounds whose end was posted
};

}  // namespace ddprun::rounds
