#pragma once
#include "ddprun/runtime/heartbeat.hpp"

namespace ddprun::runtime {
inline void heartbeat_now() { heartbeat(); }
}  // namespace ddprun::runtime
