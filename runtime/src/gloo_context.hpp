#pragma once
// A Gloo context connected to its peers through ddprun's store (private).

#include <memory>
#include <string>

#include <gloo/rendezvous/context.h>

#include "ddprun/runtime/process_group.hpp"

namespace ddprun::rendezvous {
class Store;
}

namespace ddprun::runtime {

// Connects rank `rank` of `size` to every peer (a full mesh over TCP), exchanging addresses
// under `store`'s keys. The address peers use: options.gloo_hostname, else 127.0.0.1 when the
// store is on loopback, else this host's name. Throws NetworkError naming the address and the
// time-out.
std::shared_ptr<gloo::rendezvous::Context> connect_gloo(std::shared_ptr<rendezvous::Store> store, int rank, int size,
                                                        const ProcessGroupOptions& options,
                                                        const std::string& store_host);

// Whether Gloo's error message says a peer closed its connections (it is exiting).
bool gloo_peer_left(const std::string& message);

}  // namespace ddprun::runtime
