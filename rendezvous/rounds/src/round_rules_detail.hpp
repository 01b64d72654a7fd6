#pragma once
// What round_rules.cpp, round_rules_outside.cpp and round_rules_stop.cpp share.

#include <chrono>
#include <cstdint>

#include "backend.hpp"

namespace ddprun::rounds::detail {

constexpr long long kMaxNodes = 1 << 20;
// r<R+1>/rc when the job ended with round R.
constexpr const char* kFinished = "finished";
// What a membership request takes off r<R>/succeeded: the members' reports never reach the
// round's size after it.
constexpr std::int64_t kRequest = 1LL << 40;

inline long long wall_ms(const TimeSource& time) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(time.wall().time_since_epoch()).count();
}

}  // namespace ddprun::rounds::detail
