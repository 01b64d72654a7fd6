#pragma once
// What a Reducer does once, at construction (private): the ranks agree on the parameters, and
// rank 0's values reach every rank.

#include <vector>

#include "ddprun/runtime/process_group.hpp"
#include "ddprun/runtime/reducer.hpp"

namespace ddprun::runtime {

// A collective: throws UsageError naming the ranks and what they registered when the ranks'
// parameter lists differ (number, sizes, types or order). Without it, buckets of different
// sizes would meet in one all-reduce.
void agree_on_parameters(ProcessGroup& group, const std::vector<ParameterSpec>& params);

// Broadcasts every parameter's data from rank 0. Throws UsageError (before any collective)
// when a parameter has no data.
void broadcast_parameters(ProcessGroup& group, const std::vector<ParameterSpec>& params);

}  // namespace ddprun::runtime
