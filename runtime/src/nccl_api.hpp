#pragma once
// The NCCL and CUDA calls the nccl backend makes, behind a thin interface (private). The
// backend's logic (nccl_group.cpp, nccl_core.cpp: enqueue, the watchdog, time-outs, aborts,
// teardown, the broken-group rule, subgroups, compression) is written against it and compiled in
// every build, so unit tests drive it with a fake (tests/fakes) on machines without a GPU;
// nccl_api_cuda.cpp is the real implementation, built with CUDA and NCCL.
//
// Handles are opaque pointers (ncclComm_t, cudaStream_t, cudaEvent_t). Every call reports a
// Status; kError carries NCCL's message, kCudaError CUDA's (also when NCCL reports that a CUDA
// call of its own failed). Calls that work on the device apply to the calling thread's current
// device: the caller sets it (set_device) on every thread it calls from.
//
// Communicators are blocking: a call returns once its work is enqueued (init and split once the
// communicator exists), and comm_abort, from another thread, ends a call that waits for a peer.

#include <cstddef>
#include <memory>
#include <string>

#include "ddprun/runtime/types.hpp"

namespace ddprun::rendezvous {
class Store;
}

namespace ddprun::runtime::nccl {

struct Status {
  enum Code { kSuccess, kInProgress, kError, kCudaError } code = kSuccess;
  std::string message;  // kError, kCudaError: what NCCL or CUDA said
  static Status ok() { return {}; }
  static Status in_progress() { return {kInProgress, {}}; }
  static Status error(std::string m) { return {kError, std::move(m)}; }
  static Status cuda_error(std::string m) { return {kCudaError, std::move(m)}; }
  bool is_ok() const { return code == kSuccess; }
  bool failed() const { return code == kError || code == kCudaError; }
};

using Handle = void*;

class Api {
 public:
  virtual ~Api() = default;

  // Devices (of the calling thread).
  virtual int device_count() = 0;  // 0 when no device is usable (no driver counts as 0)
  virtual Status get_device(int* device) = 0;
  virtual Status set_device(int device) = 0;

  // Streams and memory. Streams are non-blocking (never ordered with the legacy NULL stream).
  virtual Status stream_create(Handle* stream) = 0;
  virtual void stream_destroy(Handle stream) = 0;
  virtual Status malloc(void** p, std::size_t bytes) = 0;  // contents undefined
  virtual void free(void* p) = 0;
  virtual Status copy_async(void* dst, const void* src, std::size_t bytes, bool to_device, Handle stream) = 0;
  virtual Status memset_async(void* p, std::size_t bytes, Handle stream) = 0;  // to zero
  // out[i] = (out_type)((float)in[i] * scale), for float32 <-> float16 / bfloat16 (a kernel).
  virtual Status cast_async(const void* in, DataType in_type, void* out, DataType out_type, std::size_t count,
                            float scale, Handle stream) = 0;

  // Events: record on a stream, make a stream wait for one, poll one, block on one.
  virtual Status event_create(Handle* event) = 0;
  virtual void event_destroy(Handle event) = 0;
  virtual Status event_record(Handle event, Handle stream) = 0;
  virtual Status stream_wait_event(Handle stream, Handle event) = 0;
  virtual Status event_query(Handle event) = 0;  // kSuccess: reached; kInProgress: not yet
  virtual Status event_synchronize(Handle event) = 0;

  // Communicators.
  virtual Status unique_id(std::string* bytes) = 0;
  virtual Status comm_init(Handle* comm, int size, const std::string& unique_id, int rank) = 0;
  // Collective over `parent`: ranks with the same color >= 0 form a communicator ordered by key
  // (then parent rank); color < 0 takes part and gets nullptr.
  virtual Status comm_split(Handle parent, int color, int key, Handle* child) = 0;
  virtual Status async_error(Handle comm) = 0;  // kSuccess or the error a peer or NCCL reported
  virtual Status comm_destroy(Handle comm) = 0;
  virtual Status comm_abort(Handle comm) = 0;

  // Collectives, enqueued on `stream`.
  virtual Status all_reduce(const void* in, void* out, std::size_t count, DataType type, ReduceOp op, Handle comm,
                            Handle stream) = 0;
  virtual Status broadcast(void* data, std::size_t count, DataType type, int root, Handle comm, Handle stream) = 0;
  virtual Status all_gather(const void* in, void* out, std::size_t count, DataType type, Handle comm,
                            Handle stream) = 0;
  virtual Status reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op, Handle comm,
                                Handle stream) = 0;
};

// The real NCCL and CUDA: nccl_api_cuda.cpp, in the plugin libddprun_runtime_nccl-VERSION.so
// that nccl_loader.cpp loads on first use (builds with NCCL only). Throws UsageError saying
// where it looked when the plugin (or the CUDA and NCCL it needs) cannot be loaded.
std::shared_ptr<Api> make_cuda_api();
// Whether the plugin loads here.
bool plugin_loadable();

// The unique id exchange through the store: rank 0 creates the id and publishes it under
// kNcclUniqueIdKey; every other rank waits for it and checks its size.
std::string exchange_unique_id(Api& api, rendezvous::Store& store, int rank);

}  // namespace ddprun::runtime::nccl
