#include "gloo_ring.hpp"

#include <algorithm>
#include <cstring>
#include <memory>

#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include "ddprun/common/error.hpp"
#include "gloo_reduce.hpp"

namespace ddprun::runtime {
namespace {

// Gloo's slot prefixes end at 0x08 (types.h); ours for the ring reduce-scatter.
constexpr std::uint8_t kReduceScatterSlotPrefix = 0x0D;
constexpr std::size_t kSegmentBytes = 1 << 20;

}  // namespace

// A ring: n-1 steps; in step s this rank sends its partial of block (r-s-1) to the next rank
// and combines the previous rank's partial of block (r-s-2) with its own input, so after the
// last step it holds block r reduced over every rank. Each rank sends (n-1)/n of the input:
// half of what an all-reduce followed by a slice moves. Step 0 sends straight from the input;
// partials alternate between two buffers, and the last step writes into `out`. Blocks move in
// segments, all posted at once, so transfers overlap the reductions. Every wait is bounded by
// the time-out.
void ring_reduce_scatter(gloo::Context& context, int rank, int size, const RingReduceScatter& call,
                         std::chrono::milliseconds t, std::uint32_t tag, RingScratch& scratch) {
  const auto [in, out, count, type, op] = call;
  const std::size_t esize = element_size(type);
  const std::size_t block = count * esize;
  const auto n = static_cast<std::size_t>(size);
  const auto r = static_cast<std::size_t>(rank);
  if (block == 0) return;
  if (size == 1) {
    std::memmove(out, in, block);
    return;
  }
  const char* src = static_cast<const char*>(in);
  char* incoming = scratch.get(0, block);
  char* work[2] = {n > 2 ? scratch.get(1, block) : nullptr, n > 3 ? scratch.get(2, block) : nullptr};
  auto input_buf = context.createUnboundBuffer(const_cast<char*>(src), block * n);  // only sent from
  auto incoming_buf = context.createUnboundBuffer(incoming, block);
  std::unique_ptr<gloo::transport::UnboundBuffer> work_buf[2];
  for (int i = 0; i < 2; ++i) {
    if (work[i]) work_buf[i] = context.createUnboundBuffer(work[i], block);
  }
  const auto slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
  const int right = static_cast<int>((r + 1) % n), left = static_cast<int>((r + n - 1) % n);
  const auto deadline = std::chrono::steady_clock::now() + t;
  auto left_ms = [&] {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - std::chrono::steady_clock::now()));
  };
  auto reduce = reduce_function(type, op);
  const std::size_t seg = std::max<std::size_t>(esize, (kSegmentBytes / esize) * esize);
  const std::size_t segments = (block + seg - 1) / seg;
  for (std::size_t step = 0; step + 1 < n; ++step) {
    const std::size_t send_block = (r + 2 * n - step - 1) % n;
    const std::size_t recv_block = (r + 2 * n - step - 2) % n;
    gloo::transport::UnboundBuffer* sender = step == 0 ? input_buf.get() : work_buf[(step - 1) % 2].get();
    const std::size_t send_base = step == 0 ? send_block * block : 0;
    char* dest = step + 2 == n ? static_cast<char*>(out) : work[step % 2];
    for (std::size_t k = 0; k < segments; ++k) {
      std::size_t off = k * seg, len = std::min(seg, block - off);
      incoming_buf->recv(left, slot, off, len);
      sender->send(right, slot, send_base + off, len);
    }
    for (std::size_t k = 0; k < segments; ++k) {
      if (!incoming_buf->waitRecv(left_ms())) throw TimeoutError("timed out waiting for the previous rank");
      std::size_t off = k * seg, len = std::min(seg, block - off);
      reduce(dest + off, src + recv_block * block + off, incoming + off, len / esize);
    }
    for (std::size_t k = 0; k < segments; ++k) {
      if (!sender->waitSend(left_ms())) throw TimeoutError("timed out sending to the next rank");
    }
  }
  if (op == ReduceOp::kAvg) divide_in_place(out, count, type, size);
}

}  // namespace ddprun::runtime
