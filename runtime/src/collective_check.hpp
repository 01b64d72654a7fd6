#pragma once
// What each collective is, for checking that every rank calls the same one (private).
//
// Every gloo collective carries a fingerprint: its kind, count, element type, reduction and
// root. A 16-bit hash of it goes into the Gloo tag (so into the slot its messages travel on):
// ranks that call different collectives never exchange bytes, so Gloo never sees a message of
// the wrong size (its device thread would abort the process on one). They wait instead; when
// the wait times out, the ranks compare fingerprints through the store and the error names the
// difference. With DDPRUN_DISTRIBUTED_DEBUG=detail (ProcessGroupOptions::check_collectives) the
// ranks exchange fingerprints before each collective and a mismatch fails at once.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/runtime/types.hpp"

namespace ddprun::rendezvous {
class Store;
}

namespace ddprun::runtime {

enum class CollectiveKind : std::uint8_t { kAllReduce = 1, kBroadcast, kAllGather, kReduceScatter, kBarrier };

struct Fingerprint {
  std::uint64_t seq = 0;    // the group's sequence number of the call (from 1)
  std::uint64_t count = 0;  // elements
  CollectiveKind kind = CollectiveKind::kBarrier;
  DataType type = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  std::uint8_t has_type = 0;  // barrier: no count, type or op
  std::int32_t root = -1;     // broadcast only

  static Fingerprint of(CollectiveKind kind, std::size_t count = 0, DataType type = DataType::kFloat32,
                        ReduceOp op = ReduceOp::kSum, int root = -1);
  // Everything but the sequence number.
  bool same_call(const Fingerprint& o) const;
  // 1..0xFFFF (never 0: tag hash 0 is the debug mode's own exchange).
  std::uint16_t hash() const;
  // "all_reduce(count 8, float32, avg)"
  std::string describe() const;
  std::string bytes() const;
  static std::optional<Fingerprint> from_bytes(const std::string& b);
};

// The Gloo tag of call `fp`: hash in the high 16 bits, the sequence number's low 16 bits below.
std::uint32_t collective_tag(const Fingerprint& fp);
// The tag of the debug mode's fingerprint exchange before call `seq`.
std::uint32_t check_tag(std::uint64_t seq);

// Empty when every rank's fingerprint (index = rank) is the same call; else a message naming
// the ranks and how they differ, e.g. "rank 0 called all_reduce(count 8, ...); rank 1 called ...".
std::string mismatch_text(const std::vector<Fingerprint>& by_rank);

// The error text of a mismatch: "gloo: all_reduce #3 on rank 0 of 2[ timed out after 2 s]: the
// ranks called different collectives: DIFF. Every rank must ..." (`timed_out_after` empty: found
// before the call, by the debug mode).
std::string mismatch_message(const char* what, const Fingerprint& fp, int rank, int size,
                             const std::string& timed_out_after, const std::string& diff);

// After a time-out: publishes this rank's fingerprint under the group's store and reads the
// other ranks' for at most `grace`. A message (mismatch_text) when a peer called something else;
// empty when they all match or some did not answer (stalled, dead, or elsewhere). Never throws.
std::string compare_through_store(rendezvous::Store& store, const Fingerprint& mine, int rank, int size,
                                  std::chrono::milliseconds grace);

// DDPRUN_DISTRIBUTED_DEBUG: "detail" -> true; unset, "", "off" -> false; anything else is a
// UsageError naming the values (case-insensitive, as PyTorch's TORCH_DISTRIBUTED_DEBUG).
bool distributed_debug_from_env();

}  // namespace ddprun::runtime
