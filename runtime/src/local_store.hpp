#pragma once
// A store in this process's memory (private): a world of one, started without a launcher, has
// no peers to meet and needs no server.

#include <memory>

#include "ddprun/rendezvous/store.hpp"

namespace ddprun::runtime {

std::shared_ptr<rendezvous::Store> make_local_store();

}  // namespace ddprun::runtime
