#pragma once
// Factories of the backends (private).

#include <memory>
#include <string>

#include "ddprun/runtime/process_group.hpp"

namespace ddprun::runtime {

std::shared_ptr<ProcessGroup> make_gloo_process_group(std::shared_ptr<rendezvous::Store> store, int rank, int size,
                                                      const ProcessGroupOptions& options, const std::string& store_host);
#ifdef DDPRUN_WITH_NCCL
std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<rendezvous::Store> store, int rank, int size,
                                                      const ProcessGroupOptions& options, int local_rank);
#endif

}  // namespace ddprun::runtime
