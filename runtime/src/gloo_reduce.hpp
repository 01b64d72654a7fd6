#pragma once
// The element-wise kernels of the gloo backend: c[i] = a[i] op b[i] for every data type and
// reduction, and the division of AVG. Compiled with -O3 (vectorised, with run-time alias checks,
// since Gloo reduces in place): they run over every byte of every all-reduce.

#include <cstddef>

#include <gloo/allreduce.h>

#include "ddprun/runtime/types.hpp"

namespace ddprun::runtime {

gloo::AllreduceOptions::Func reduce_function(DataType t, ReduceOp op);
void divide_in_place(void* data, std::size_t n, DataType t, int by);

}  // namespace ddprun::runtime
