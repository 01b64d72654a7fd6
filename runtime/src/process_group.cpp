#include "ddprun/runtime/process_group.hpp"

#include <csignal>
#include <mutex>

#include "ddprun/common/error.hpp"
#include "ddprun/rendezvous/prefix_store.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"
#include "ddprun/runtime/env.hpp"
#include "process_groups.hpp"

namespace ddprun::runtime {

bool nccl_available() {
#ifdef DDPRUN_WITH_NCCL
  return true;
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

std::shared_ptr<ProcessGroup> create(const std::string& backend, std::shared_ptr<rendezvous::Store> store, int rank,
                                     int size, const ProcessGroupOptions& options, const std::string& store_host,
                                     int local_rank) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw UsageError("process group: rank " + std::to_string(rank) + " is not within a group of " + std::to_string(size));
  }
  ignore_sigpipe();
  if (backend == "gloo") {
    return make_gloo_process_group(std::make_shared<rendezvous::PrefixStore>("gloo", std::move(store)), rank, size,
                                   options, store_host);
  }
  if (backend == "nccl") {
#ifdef DDPRUN_WITH_NCCL
    return make_nccl_process_group(std::make_shared<rendezvous::PrefixStore>("nccl", std::move(store)), rank, size,
                                   options, local_rank);
#else
    (void)local_rank;
    throw UsageError("process group: this build of ddprun has no NCCL backend (CUDA and NCCL were not found when it "
                     "was built); use \"gloo\"");
#endif
  }
  throw UsageError("process group: unknown backend '" + backend + "' (use \"gloo\" or \"nccl\")");
}

}  // namespace

std::shared_ptr<ProcessGroup> create_process_group(const std::string& backend, std::shared_ptr<rendezvous::Store> store,
                                                   int rank, int size, const ProcessGroupOptions& options) {
  return create(backend, std::move(store), rank, size, options, "127.0.0.1", rank);
}

std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend, const ProcessGroupOptions& options) {
  return init_process_group(backend, DistEnv::from_environment(), options);
}

std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend, const DistEnv& env,
                                                 const ProcessGroupOptions& options) {
  rendezvous::TcpStoreOptions so;
  so.host = env.master_addr;
  so.port = env.master_port;
  so.timeout = options.timeout;
  auto store = std::make_shared<rendezvous::TcpStore>(so);
  auto attempt = std::make_shared<rendezvous::PrefixStore>("ddprun/attempt_" + std::to_string(env.restart_count), store);
  return create(backend, attempt, env.rank, env.world_size, options, env.master_addr, env.local_rank);
}

}  // namespace ddprun::runtime
