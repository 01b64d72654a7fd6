#pragma once
// The NCCL unique id exchange through the store (private): rank 0 creates the id and publishes
// it; every other rank waits for it. What llm.c-style trainers do by hand over MPI, sockets or
// files and sleep().

#include <chrono>
#include <string>

namespace ddprun::rendezvous {
class Store;
}

namespace ddprun::runtime {

// The key under the group's store prefix.
inline constexpr const char* kNcclUniqueIdKey = "unique_id";

// Returns the id's bytes (sizeof(ncclUniqueId)). Throws ddprun::TimeoutError naming the key when
// rank 0 does not publish it within the store's timeout.
std::string exchange_nccl_unique_id(rendezvous::Store& store, int rank);

}  // namespace ddprun::runtime
