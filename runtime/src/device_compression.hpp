#pragma once
// Gradient compression done by a process group on its own memory (private; the Reducer's hook,
// as DDP's fp16_compress_hook / bf16_compress_hook): the nccl backend casts float32 buckets to
// 16 bits in a kernel on its stream, all-reduces them, and casts them back.

#include <cstddef>
#include <memory>

#include "ddprun/runtime/process_group.hpp"

namespace ddprun::runtime {

class DeviceCompression {
 public:
  virtual ~DeviceCompression() = default;
  // The average over ranks of `count` float32 at `data`, travelling as `wire` (kFloat16 or
  // kBFloat16) through `scratch` (count 16-bit elements of the group's memory): each rank's
  // values are divided by the group size, cast, summed, and cast back into `data`.
  virtual std::shared_ptr<Work> all_reduce_compressed_async(float* data, std::size_t count, DataType wire,
                                                            void* scratch) = 0;
};

}  // namespace ddprun::runtime
