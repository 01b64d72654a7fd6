#include "ddprun/runtime/process_group.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <mutex>

#include "ddprun/common/error.hpp"
#include "ddprun/rendezvous/prefix_store.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"
#include "ddprun/runtime/env.hpp"
#include "collective_check.hpp"
#include "group_keys.hpp"
#include "local_store.hpp"
#ifdef DDPRUN_WITH_NCCL
#include "nccl_api.hpp"
#endif
#include "process_groups.hpp"

namespace ddprun::runtime {

bool nccl_available() {
#ifdef DDPRUN_WITH_NCCL
  return nccl::plugin_loadable();
#else
  return false;
#endif
}

namespace {

// Gloo writes to its sockets without MSG_NOSIGNAL: a write to a peer that died would kill this
// process with SIGPIPE instead of failing the collective with an error. Ignore SIGPIPE, as
// Python does for every PyTorch worker, unless the program installed its own handler.
void ignore_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current{};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  });
}

// Where a rank runs, for the nccl backend's choice of device.
struct Local {
  int rank = 0;
  int size = 1;
};

std::shared_ptr<ProcessGroup> create(const std::string& backend, const std::shared_ptr<rendezvous::Store>& store,
                                     int rank, int size, const ProcessGroupOptions& given,
                                     const std::string& store_host, Local local) {
  ProcessGroupOptions options = given;
  options.check_collectives = options.check_collectives || distributed_debug_from_env();
  if (size < 1 || rank < 0 || rank >= size) {
    throw UsageError("process group: rank " + std::to_string(rank) + " is not within a group of " + std::to_string(size));
  }
  if (backend != "gloo" && backend != "nccl") {
    throw UsageError("process group: unknown backend '" + backend + "' (use \"gloo\" or \"nccl\")");
  }
  ignore_sigpipe();
  if (backend == "gloo") {
    return make_gloo_process_group(next_group_store(store, rank), rank, size, options, store_host);
  }
#ifdef DDPRUN_WITH_NCCL
  return make_nccl_process_group(next_group_store(store, rank), rank, size, options, local.rank, local.size);
#else
  (void)local;
  throw UsageError("process group: this build of ddprun has no NCCL backend (CUDA and NCCL were not found when it "
                   "was built); use \"gloo\"");
#endif
}

}  // namespace

std::shared_ptr<ProcessGroup> create_process_group(const std::string& backend, std::shared_ptr<rendezvous::Store> store,
                                                   int rank, int size, const ProcessGroupOptions& options) {
  return create(backend, store, rank, size, options, "127.0.0.1", Local{rank, size});
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key) { return split(color, key, options()); }

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(std::vector<int> ranks) {
  return new_group(std::move(ranks), options());
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(std::vector<int> ranks, const ProcessGroupOptions& options) {
  auto members = checked_members(std::move(ranks), size());
  bool member = std::binary_search(members.begin(), members.end(), rank());
  return split(member ? 0 : kNoColor, rank(), options);
}

std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend, const ProcessGroupOptions& options) {
  return init_process_group(backend, DistEnv::from_environment(), options);
}

std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend, const DistEnv& env,
                                                 const ProcessGroupOptions& options) {
  if (env.standalone) {
    // No launcher: a world of one, said once, on a store in this process.
    std::fprintf(stderr, "ddprun: no launcher variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) are set: running as a "
                         "world of one (rank 0 of 1); start the program with ddprun for more ranks\n");
    return create(backend, make_local_store(), 0, 1, options, "127.0.0.1", Local{0, 1});
  }
  rendezvous::TcpStoreOptions so;
  so.host = env.master_addr;
  so.port = env.master_port;
  so.timeout = options.timeout;
  so.pointed_by = "MASTER_ADDR, MASTER_PORT";
  auto store = std::make_shared<rendezvous::TcpStore>(so);
  std::shared_ptr<rendezvous::Store> attempt =
      std::make_shared<rendezvous::PrefixStore>("ddprun/attempt_" + std::to_string(env.restart_count), store);
  ProcessGroupOptions o = options;
  o.share_devices = o.share_devices || env.share_devices;
  return create(backend, attempt, env.rank, env.world_size, o, env.master_addr,
                Local{env.local_rank, env.local_world_size});
}

}  // namespace ddprun::runtime
