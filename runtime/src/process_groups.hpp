#pragma once
// Factories of the backends (private).

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "ddprun/common/text.hpp"
#include "ddprun/runtime/process_group.hpp"

namespace ddprun::runtime {

// "1.5 s", for time-out messages.
inline std::string seconds_text(std::chrono::milliseconds d) { return duration_text(d); }

// `store` holds the new group's keys only (group_keys.hpp).
std::shared_ptr<ProcessGroup> make_gloo_process_group(std::shared_ptr<rendezvous::Store> store, int rank, int size,
                                                      const ProcessGroupOptions& options, const std::string& store_host);
#ifdef DDPRUN_WITH_NCCL
// local_rank and local_size: this rank's place on its machine, for the choice of its device.
std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<rendezvous::Store> store, int rank, int size,
                                                      const ProcessGroupOptions& options, int local_rank,
                                                      int local_size);
#endif

}  // namespace ddprun::runtime
