#pragma once
// Process groups: collectives among the ranks of a job, behind one interface. "gloo" works on
// host memory (TCP); "nccl" on CUDA device memory (built when CUDA and NCCL are found).
//
// Every collective has a timeout; a peer that died or stalled gives ddprun::NetworkError or
// ddprun::TimeoutError, never a hang. After such an error the group is unusable (as in PyTorch):
// the job should exit and let the launcher restart it. Collectives must be called in the same
// order on every rank. A group is used from one thread at a time. Asynchronous all-reduces may
// run concurrently with each other (they must not share buffers until waited for); every other
// operation starts after everything issued before it has finished.

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "ddprun/runtime/types.hpp"

namespace ddprun::rendezvous {
class Store;
}

namespace ddprun::runtime {

struct DistEnv;

// A pending asynchronous collective.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation is done (for NCCL: until it is enqueued after the compute
  // stream and will complete before later work on it). Throws what the collective threw.
  virtual void wait() = 0;
};

struct ProcessGroupOptions {
  // Default timeout of every collective (and of connecting the group).
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // gloo: the address peers use to reach this process; empty = 127.0.0.1 when the store is on
  // loopback, else this host's name.
  std::string gloo_hostname;
  // nccl: the CUDA device; -1 = the local rank modulo the device count.
  int device = -1;
  // gloo: communication threads that asynchronous all-reduces rotate over (1-16). Several let
  // consecutive collectives (the Reducer's buckets) overlap instead of each one filling and
  // draining its ring alone.
  int gloo_threads = 3;
};

class ProcessGroup {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{-1};  // = options.timeout

  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;

  // In-place reduction of `count` elements at `data` across all ranks.
  virtual void all_reduce(void* data, std::size_t count, DataType type, ReduceOp op,
                          std::chrono::milliseconds timeout = kDefaultTimeout) {
    all_reduce_async(data, count, type, op, timeout)->wait();
  }
  virtual std::shared_ptr<Work> all_reduce_async(void* data, std::size_t count, DataType type, ReduceOp op,
                                                 std::chrono::milliseconds timeout = kDefaultTimeout) = 0;
  // Copies root's `count` elements at `data` to every rank's `data`.
  virtual void broadcast(void* data, std::size_t count, DataType type, int root,
                         std::chrono::milliseconds timeout = kDefaultTimeout) = 0;
  // out = the concatenation of every rank's `count` elements, in rank order (size * count).
  virtual void all_gather(const void* in, void* out, std::size_t count, DataType type,
                          std::chrono::milliseconds timeout = kDefaultTimeout) = 0;
  // Reduces size * count elements of `in` across ranks; rank r receives block r in `out`.
  virtual void reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                              std::chrono::milliseconds timeout = kDefaultTimeout) = 0;
  virtual void barrier(std::chrono::milliseconds timeout = kDefaultTimeout) = 0;

  // Memory the group's collectives work on (host for gloo, device for nccl), zero-filled.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p) = 0;
  // Copies between host memory and memory from allocate() (a plain memcpy for gloo).
  virtual void copy_to_device(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, std::size_t bytes) = 0;
  // nccl: the CUDA stream (a cudaStream_t) the trainer computes gradients on; collectives wait
  // for the work queued on it. Ignored by gloo.
  virtual void set_compute_stream(void* stream) { (void)stream; }
};

// Creates a group of `size` ranks rendezvousing through `store` (keys under its prefix).
// The first call sets SIGPIPE to ignored if it had its default action (as Python does): a peer
// that died then gives an error, not a SIGPIPE death.
// backend: "gloo" or "nccl". Throws ddprun::UsageError for an unknown or unavailable backend.
std::shared_ptr<ProcessGroup> create_process_group(const std::string& backend, std::shared_ptr<rendezvous::Store> store,
                                                   int rank, int size, const ProcessGroupOptions& options = {});

// Whether this build has the NCCL backend.
bool nccl_available();

// One call for a worker started by ddprun (or torchrun): reads the environment, connects to the
// store at MASTER_ADDR:MASTER_PORT under the prefix "ddprun/attempt_<TORCHELASTIC_RESTART_COUNT>"
// (so a restarted attempt never sees the keys of an earlier one) and creates the group.
std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend, const ProcessGroupOptions& options = {});
std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend, const DistEnv& env,
                                                 const ProcessGroupOptions& options = {});

}  // namespace ddprun::runtime
