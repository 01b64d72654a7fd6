#pragma once
// The NCCL and CUDA calls the nccl backend makes, behind a thin interface (private). The
// backend's state machine (nccl_group.cpp: enqueue, watch, time-outs, aborts, teardown, the
// broken-group rule) is written against it and compiled in every build, so unit tests drive it
// with a fake that injects failures on machines without a GPU; nccl_api_cuda.cpp is the real
// implementation, built with CUDA and NCCL.
//
// Handles are opaque pointers (ncclComm_t, cudaStream_t, cudaEvent_t). Every call reports a
// Status; kInProgress means "not yet" (a non-blocking communicator still working, an event not
// reached), kError carries NCCL's or CUDA's message.

#include <cstddef>
#include <memory>
#include <string>

#include "ddprun/runtime/process_group.hpp"
#include "ddprun/runtime/types.hpp"

namespace ddprun::rendezvous {
class Store;
}

namespace ddprun::runtime::nccl {

struct Status {
  enum Code { kSuccess, kInProgress, kError } code = kSuccess;
  std::string message;  // kError: what NCCL or CUDA said
  static Status ok() { return {}; }
  static Status in_progress() { return {kInProgress, {}}; }
  static Status error(std::string m) { return {kError, std::move(m)}; }
  bool is_ok() const { return code == kSuccess; }
};

using Handle = void*;

class Api {
 public:
  virtual ~Api() = default;

  // Devices and memory.
  virtual int device_count() = 0;  // 0 when no device is usable (no driver counts as 0)
  virtual Status set_device(int device) = 0;
  virtual Status stream_create(Handle* stream) = 0;  // non-blocking stream
  virtual void stream_destroy(Handle stream) = 0;
  virtual Status malloc(void** p, std::size_t bytes) = 0;  // zero-filled
  virtual void free(void* p) = 0;
  virtual Status copy(void* dst, const void* src, std::size_t bytes, bool to_device) = 0;

  // Events: record on a stream, make a stream wait for one, poll one.
  virtual Status event_create(Handle* event) = 0;
  virtual void event_destroy(Handle event) = 0;
  virtual Status event_record(Handle event, Handle stream) = 0;
  virtual Status stream_wait_event(Handle stream, Handle event) = 0;
  virtual Status event_query(Handle event) = 0;  // kSuccess: reached; kInProgress: not yet

  // Communicators (non-blocking: calls may answer kInProgress; poll async_error).
  virtual Status unique_id(std::string* bytes) = 0;
  virtual Status comm_init(Handle* comm, int size, const std::string& unique_id, int rank) = 0;
  virtual Status async_error(Handle comm) = 0;  // kSuccess, kInProgress, or the error
  virtual Status comm_finalize(Handle comm) = 0;
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

// The real NCCL and CUDA (nccl_api_cuda.cpp); nullptr in a build without them.
std::unique_ptr<Api> make_cuda_api();

// The unique id exchange through the store: rank 0 creates the id and publishes it under
// kNcclUniqueIdKey; every other rank waits for it and checks its size.
std::string exchange_unique_id(Api& api, rendezvous::Store& store, int rank);

// The nccl process group on `api`. `poll_interval`: how often a pending operation is checked.
std::shared_ptr<ProcessGroup> make_process_group(std::unique_ptr<Api> api, std::shared_ptr<rendezvous::Store> store,
                                                 int rank, int size, const ProcessGroupOptions& options,
                                                 int local_rank);

}  // namespace ddprun::runtime::nccl
