#pragma once
// The workers' store (MASTER_ADDR:MASTER_PORT, a plain TCPStore for PyTorch) of a multi-node
// round, hosted by the round's group rank 0 on every backend. It is advertised at an address
// every member can reach: --local_addr, else the address this node would use to reach another
// member (routing decides; never a bare host name, which may resolve to loopback). Only this
// host's processes of this user, and the round's members' addresses, are served. host() and
// release() are virtual for the simulator, which hosts no store.

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "ddprun/rounds/rendezvous.hpp"
#include "round_state.hpp"

namespace ddprun::rendezvous {
class StoreServer;
}

namespace ddprun::rounds {

class WorkersStore {
 public:
  WorkersStore(std::string local_addr, std::size_t reserved_fds);
  virtual ~WorkersStore();

  // This node is group rank 0 of `info`: serves the round (started once, emptied for each
  // round, its allow-list the members' addresses) and returns where it is advertised.
  // Throws ddprun::Error when it cannot listen.
  virtual StoreAddress host(const RoundInfo& info);
  // Another node hosts it now.
  virtual void release();
  // The store while this node hosts it (metrics). Any thread.
  std::optional<HostedStore> observe() const;

 private:
  std::string local_addr_;
  std::size_t reserved_fds_;
  mutable std::mutex mu_;  // server_ is replaced on the coordinator thread, observed from others
  std::shared_ptr<rendezvous::StoreServer> server_;
};

// A hosted store's figures, `role` as named in HostedStore.
HostedStore observe_store(const std::string& role, rendezvous::StoreServer& s);

// The address group rank 0 advertises: `local_addr`, else its source address towards the
// first other member (by that member's reach address), else its own reach address.
std::string advertised_address(const std::string& local_addr, const RoundInfo& info);

}  // namespace ddprun::rounds
