#pragma once
// The nccl process group (private; nccl_group.cpp) on the nccl::Api seam, and its choice of
// device.

#include <memory>

#include "ddprun/runtime/process_group.hpp"
#include "nccl_api.hpp"

namespace ddprun::rendezvous {
class Store;
}

namespace ddprun::runtime::nccl {

// Where a rank runs, for the choice of its device.
struct Placement {
  int local_rank = 0;
  int local_size = 1;  // ranks of the job on this machine
};

// The device of a rank: options.device, or the local rank. Throws UsageError for a device that
// does not exist, and for more ranks on this machine than `devices` unless
// options.share_devices (then ranks share them: local_rank % devices).
int choose_device(int devices, const ProcessGroupOptions& options, Placement placement, int rank);

// Creates the group: picks the device, exchanges the unique id through `store` (which holds
// this group's keys only), initialises the communicator within options.timeout.
std::shared_ptr<ProcessGroup> make_process_group(std::shared_ptr<Api> api, std::shared_ptr<rendezvous::Store> store,
                                                 int rank, int size, const ProcessGroupOptions& options,
                                                 Placement placement);

}  // namespace ddprun::runtime::nccl
