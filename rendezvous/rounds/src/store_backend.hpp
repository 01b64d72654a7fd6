#pragma once
// The round records in a c10d TCPStore (torchrun's static and c10d backends): hosted by one of
// the agents (the node whose address is the endpoint, or is_host=1), or by an external
// ddprun-store (every agent is_host=0). Keys live under "ddprun/rdzv/<run_id>/". Liveness is a
// ring: each node bumps its keep-alive counter every keep_alive_interval and watches the next
// node's (O(1) requests per node); a counter that has not moved for interval x max_attempt is a
// lost node.

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "backend.hpp"
#include "ddprun/rounds/options.hpp"
#include "name_wait.hpp"

namespace ddprun::rendezvous {
class StoreServer;
}

namespace ddprun::rounds {

class StoreBackend : public Backend {
 public:
  // How long a host that ended on an error waits, at exit, for the other nodes to close.
  static constexpr std::chrono::milliseconds kHostLingers{2000};

  // Hosts the rendezvous store when this node is its host (binding only). Throws ddprun::Error
  // when host_role is `always` and the port cannot be bound. With host_role `automatic` and an
  // endpoint name that does not resolve yet, the first connect() decides, once it resolves.
  StoreBackend(const RendezvousOptions& opt, std::weak_ptr<Renewals> renewals);
  // Lingers when asked to (linger_at_exit), kHostLingers at most.
  ~StoreBackend() override;

  std::string where() const override;
  // Waits (within `timeout`) for the endpoint's name to resolve first.
  std::unique_ptr<Connection> connect(std::chrono::milliseconds timeout) override;
  std::string reach() const override;
  bool holds_records() const override { return hosting_; }
  void linger_at_exit() override { linger_ = true; }
  std::vector<HostedStore> hosted() const override;
  std::chrono::milliseconds liveness_ttl() const override;
  // The store is this backend's single point of failure: the message names its host and the
  // ways out.
  std::string lost_hint() const override;
  std::unique_ptr<Liveness> watch(const Members& m, std::weak_ptr<LivenessEvents> events) override;
  bool members_silent(Connection& c, int round, int members, std::vector<long long>& seen) override {
    return counters_silent(c, round, members, seen);
  }

  // The endpoint's port: the real one when this node hosts the store on port 0.
  std::uint16_t port() const { return port_; }
  std::string endpoint() const;

 private:
  bool should_host() const;
  void decide_hosting();
  void host();

  // Constant after construction.
  RendezvousOptions opt_;
  std::weak_ptr<Renewals> renewals_;
  NameWait name_;

  // Written once, when this node decides whether it hosts the store (under decide_mu_); read
  // from any thread.
  std::mutex decide_mu_;
  std::atomic<bool> decided_{false}, hosting_{false}, linger_{false};
  std::atomic<std::uint16_t> port_;
  std::unique_ptr<rendezvous::StoreServer> server_;
};

}  // namespace ddprun::rounds
