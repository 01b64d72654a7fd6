#include "ddprun/common/error.hpp"

namespace ddprun {

int exit_code_for(const std::exception& e) noexcept {
  return dynamic_cast<const UsageError*>(&e) != nullptr ? 2 : 1;
}

}  // namespace ddprun
