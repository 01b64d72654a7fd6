#pragma once
// The gloo backend's reduce-scatter: a segmented ring over Gloo's unbound buffers (private).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <gloo/context.h>

#include "ddprun/runtime/types.hpp"

namespace ddprun::runtime {

// Working buffers of the ring, kept between calls (grow-only): allocating and first touching
// them costs more than the transfer itself for large blocks.
class RingScratch {
 public:
  char* get(int i, std::size_t bytes) {
    if (buf_[i].size() < bytes) {
      buf_[i] = std::vector<char>();
      buf_[i].resize(bytes);
    }
    return buf_[i].data();
  }

 private:
  std::vector<char> buf_[3];
};

struct RingReduceScatter {
  const void* in;     // size blocks of count elements
  void* out;          // count elements: this rank's block, reduced over every rank
  std::size_t count;  // elements per block
  DataType type;
  ReduceOp op;
};

// Runs on `context` as rank `rank` of `size`, its messages in a slot built from `tag`. Throws
// TimeoutError when a wait passes `timeout`, Gloo's exceptions when a transfer fails.
void ring_reduce_scatter(gloo::Context& context, int rank, int size, const RingReduceScatter& call,
                         std::chrono::milliseconds timeout, std::uint32_t tag, RingScratch& scratch);

}  // namespace ddprun::runtime
