// Typed failures and option names: what crosses the Rendezvous seam besides records.
#include "ddprun/rounds/rendezvous.hpp"

#include "rendezvous_error.hpp"

namespace ddprun::rounds {

RendezvousFailure RendezvousFailure::of(const std::exception& e) {
  using K = Kind;
  if (auto* r = dynamic_cast<const RendezvousError*>(&e)) return r->failure;
  K kind = dynamic_cast<const TimeoutError*>(&e)    ? K::timeout
           : dynamic_cast<const AuthError*>(&e)     ? K::refused
           : dynamic_cast<const UsageError*>(&e)    ? K::usage
           : dynamic_cast<const ProtocolError*>(&e) ? K::malformed
                                                    : K::unreachable;
  return RendezvousFailure{kind, e.what(), 0};
}

const char* to_string(RendezvousFailure::Kind k) {
  using K = RendezvousFailure::Kind;
  switch (k) {
    case K::timeout: return "timeout";
    case K::stopped: return "stopped";
    case K::finished: return "finished";
    case K::done: return "done";
    case K::in_use: return "in_use";
    case K::refused: return "refused";
    case K::unreachable: return "unreachable";
    case K::malformed: return "malformed";
    case K::usage: return "usage";
  }
  return "?";
}

const char* to_string(BackendKind b) {
  switch (b) {
    case BackendKind::single_node: return "single node";
    case BackendKind::static_ranks: return "static";
    case BackendKind::c10d: return "c10d";
    case BackendKind::etcd: return "etcd";
  }
  return "?";
}

}  // namespace ddprun::rounds
