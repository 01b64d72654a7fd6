#pragma once
// Bucketed gradient all-reduce: what PyTorch's DDP Reducer does, for native trainers.
//
// Parameters are registered once; at construction the ranks check that they registered the same
// ones and rank 0's values are broadcast to every rank (ReducerOptions::broadcast_parameters).
// Their gradients live in buckets the Reducer owns (memory of the process group's kind: host for
// gloo, device for nccl), or in one array the program owns; the trainer writes or accumulates
// each gradient at grad(i) and calls mark_ready(i) when backward has produced it. A bucket whose
// gradients are all ready is reduced at once, asynchronously, while backward goes on; finalize()
// waits for the rest and leaves every gradient averaged across ranks.

#include <cstddef>
#include <memory>
#include <vector>

#include "ddprun/runtime/process_group.hpp"
#include "ddprun/runtime/types.hpp"

namespace ddprun::runtime {

struct ParameterSpec {
  std::size_t count = 0;                 // elements
  DataType type = DataType::kFloat32;
  // The parameter's values (memory of the group's kind): the Reducer broadcasts rank 0's to
  // every rank at construction, as PyTorch's DDP does (ReducerOptions::broadcast_parameters).
  void* data = nullptr;
};

enum class Compression : std::uint8_t {
  kNone,
  kFloat16,   // float32 buckets travel as IEEE half (halves the bytes; ~3 decimal digits)
  kBFloat16,  // float32 buckets travel as bfloat16 (float32's range, ~2 decimal digits)
};

struct ReducerOptions {
  // PyTorch's defaults: a small first bucket so communication starts early in backward, then
  // buckets up to 25 MiB (fewer, larger collectives).
  static constexpr std::size_t kDefaultFirstBucketBytes = 1024 * 1024;
  static constexpr std::size_t kDefaultBucketCapBytes = 25 * 1024 * 1024;

  std::size_t first_bucket_bytes = kDefaultFirstBucketBytes;
  std::size_t bucket_cap_bytes = kDefaultBucketCapBytes;  // bucket_cap_mb * 2^20
  // Parameters not marked ready by finalize() contribute their gradient storage as it is (zero
  // after zero_grad) instead of raising an error.
  bool find_unused_parameters = false;
  // Compression of float32 buckets on the wire: gloo casts on the host; nccl in a kernel on the
  // group's stream, dividing by the group size first (DDP's fp16/bf16_compress_hook).
  Compression compression = Compression::kNone;
  // At construction, copy rank 0's parameter values (ParameterSpec::data) to every rank, so
  // replicas start identical. On by default: a parameter without data is then a UsageError.
  // Turn it off only when the program broadcasts (or loads) identical values itself.
  bool broadcast_parameters = true;
};

class Reducer {
 public:
  // Construction is a collective of the group: every rank checks that all registered the same
  // parameters (a UsageError naming the difference otherwise), then rank 0's values are
  // broadcast (ReducerOptions::broadcast_parameters). Throws ddprun::UsageError for an empty or
  // invalid parameter list.
  Reducer(std::shared_ptr<ProcessGroup> group, std::vector<ParameterSpec> params, ReducerOptions options = {});
  // The same, reducing in place in gradient memory the program owns (llm.c style): `gradients`
  // holds every parameter's gradient back to back, in registration order, without padding
  // (memory of the group's kind, valid for the Reducer's life). grad(i) then points into it.
  // From the first mark_ready() to finalize() the array belongs to the Reducer (reduced in place
  // on communication threads): read it only after finalize(). Reads of the array itself are not
  // checked; grad(i) is, and a skipped finalize() is named at the next zero_grad()/mark_ready().
  Reducer(std::shared_ptr<ProcessGroup> group, std::vector<ParameterSpec> params, void* gradients,
          ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Gradient storage of parameter i (count elements of its type), valid for the Reducer's life.
  // Throws UsageError naming finalize() between mark_ready(i) and finalize(): the gradient is
  // then being averaged, and an optimizer must not read it (the pointer itself is not guarded).
  void* grad(std::size_t i);
  template <typename T>
  T* grad_as(std::size_t i) { return static_cast<T*>(grad(i)); }
  // Sets every gradient to zero (between optimizer steps; gradients accumulate otherwise).
  // nccl: on the group's stream, between the compute stream's earlier and later work. Throws
  // UsageError naming finalize() while an iteration's reductions are under way.
  void zero_grad();

  // Parameter i's gradient is final for this iteration. May start the reduction of its bucket
  // (and of later-ready buckets waiting for it). Throws UsageError if i was already marked, and
  // one naming finalize() when the last iteration was never finalized (its gradients were not
  // averaged).
  void mark_ready(std::size_t i);
  // Waits until every bucket is reduced: each gradient then holds the average over ranks (nccl:
  // in stream order: what the trainer queues on its compute stream afterwards sees the
  // averages, and the host does not wait for the device). Throws NetworkError / TimeoutError on
  // communication failure (nccl: a failure the watchdog has seen by then; one it sees later is
  // thrown by the group's next call), UsageError when a parameter got no gradient and
  // find_unused_parameters is off.
  void finalize();

  // While a NoSync guard lives, mark_ready and finalize communicate nothing: gradients of
  // successive micro-batches accumulate locally and are reduced once, by the first synced
  // iteration after it (gradient accumulation).
  class NoSync {
   public:
    explicit NoSync(Reducer& r) : r_(r), prev_(r.sync_) { r.sync_ = false; }
    ~NoSync() { r_.sync_ = prev_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    Reducer& r_;
    bool prev_;
  };
  NoSync no_sync() { return NoSync(*this); }

  struct BucketInfo {
    std::vector<std::size_t> params;  // parameter indices, in the order they sit in the bucket
    std::size_t bytes = 0;
    DataType type = DataType::kFloat32;
  };
  std::vector<BucketInfo> buckets() const;
  std::size_t num_parameters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool sync_ = true;
};

// Copies root's values of every tensor to all ranks, so replicas start identical (parameters
// and buffers alike). Each pointer is memory of the group's kind.
struct TensorRef {
  void* data;
  std::size_t count;
  DataType type = DataType::kFloat32;
};
void broadcast_tensors(ProcessGroup& group, const std::vector<TensorRef>& tensors, int root = 0);

}  // namespace ddprun::runtime
