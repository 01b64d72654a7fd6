#pragma once
// An error that ends a rendezvous, carrying the typed failure the listener receives.

#include "ddprun/common/error.hpp"
#include "ddprun/rounds/rendezvous.hpp"

namespace ddprun::rounds {

class RendezvousError : public Error {
 public:
  RendezvousError(RendezvousFailure::Kind kind, const std::string& message, int signal = 0)
      : Error(message), failure{kind, message, signal} {}
  RendezvousFailure failure;
};

}  // namespace ddprun::rounds
