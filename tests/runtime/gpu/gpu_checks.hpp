#pragma once
// The checks gpu_tests runs on every rank (gpu_checks.cpp), each with a real group on a GPU.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/runtime/process_group.hpp"

namespace ddprun::test::gpu {

// A check returns what went wrong on this rank ("" when nothing did). It runs on a thread whose
// current device is the group's.
struct Check {
  const char* name;
  std::function<std::string(const std::shared_ptr<runtime::ProcessGroup>&)> run;
};

std::vector<Check> checks();

}  // namespace ddprun::test::gpu
