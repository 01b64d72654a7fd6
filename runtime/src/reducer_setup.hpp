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

// Throws UsageError when a parameter has no data (local: call it before any collective).
void require_parameter_data(const std::vector<ParameterSpec>& params);

// Broadcasts every parameter's data from rank 0 (require_parameter_data first).
void broadcast_parameters(ProcessGroup& group, const std::vector<ParameterSpec>& params);

}  // namespace ddprun::runtime
