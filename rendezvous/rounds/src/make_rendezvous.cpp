// The one place that knows every Rendezvous: a single node meets nobody; several meet through
// the round rules over a store or etcd.
#include "ddprun/rounds/rendezvous.hpp"

#include "ddprun/common/error.hpp"
#include "etcd_factory.hpp"
#include "local_rendezvous.hpp"
#include "store_backend.hpp"
#include "threaded_rendezvous.hpp"

namespace ddprun::rounds {

void validate(const RendezvousOptions& opt) {
  if (opt.min_nodes < 1 || opt.max_nodes < opt.min_nodes) {
    throw UsageError("rendezvous: --nnodes=" + std::to_string(opt.min_nodes) + ":" + std::to_string(opt.max_nodes) +
                     " is not MIN:MAX with 1 <= MIN <= MAX");
  }
  if (opt.backend == BackendKind::etcd) validate_etcd(opt);
  if ((opt.backend == BackendKind::c10d || opt.backend == BackendKind::static_ranks) && opt.keep_alive_max_attempt < 2) {
    // The fence stops a node's workers a quarter of the TTL before the others may count it lost:
    // with one attempt that comes before its next keep-alive, every round.
    throw UsageError("--rdzv_conf keep_alive_max_attempt must be at least 2 (got " +
                     std::to_string(opt.keep_alive_max_attempt) + "): a node is counted lost after that many missed "
                     "keep-alives, and stops its own workers a little before");
  }
}

std::unique_ptr<Rendezvous> make_rendezvous(const RendezvousOptions& opt, Post post, Fence* fence,
                                            WhenReadable when_readable) {
  validate(opt);
  switch (opt.backend) {
    case BackendKind::single_node:
      return std::make_unique<LocalRendezvous>(opt, std::move(post), std::move(when_readable));
    case BackendKind::etcd:
      return std::make_unique<ThreadedRendezvous>(
          opt, [&](std::weak_ptr<Renewals> r) { return make_etcd_backend(opt, std::move(r)); },
          std::move(post), fence);
    case BackendKind::static_ranks:
    case BackendKind::c10d:
      break;
  }
  return std::make_unique<ThreadedRendezvous>(
      opt, [&](std::weak_ptr<Renewals> r) { return std::make_unique<StoreBackend>(opt, std::move(r)); },
      std::move(post), fence);
}

}  // namespace ddprun::rounds
