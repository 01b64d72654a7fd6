#pragma once
// Process groups: collectives among the ranks of a job, behind one interface. "gloo" works on
// host memory (TCP); "nccl" on CUDA device memory (built when CUDA and NCCL are found).
//
// Every collective has a timeout; a peer that died or stalled gives ddprun::NetworkError or
// ddprun::TimeoutError, never a hang. After such an error the group is unusable (as in PyTorch):
// the job should exit and let the launcher restart it. Collectives must be called in the same
// order on every rank. A group is used from one thread at a time (any thread: the nccl backend
// sets its CUDA device on whichever thread calls it, and puts the caller's device back before
// returning). Asynchronous all-reduces may run concurrently with each other (they must not share
// buffers until waited for); every other operation starts after everything issued before it.
//
// Streams (nccl): the group works on a CUDA stream of its own. Every collective, copy and
// zero-fill first waits for the work queued so far on the trainer's compute stream
// (set_compute_stream; the legacy NULL stream by default), and the compute stream waits for the
// group's work wherever the trainer must see its result: after Work::wait(), a synchronous
// collective, zero() or allocate(). Nothing on the host blocks on the device except
// Work::synchronize(), barrier(), copy_to_device(), copy_to_host() and deallocate() (cudaFree).
// A trainer on the per-thread default stream passes cudaStreamPerThread to set_compute_stream.
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/common/error.hpp"
#include "ddprun/runtime/types.hpp"

namespace ddprun::rendezvous {
class Store;
}

namespace ddprun::runtime {

struct DistEnv;

// A CUDA call of the nccl backend failed: the message names the call, the device and what CUDA
// said (out of memory, an illegal address left by an earlier kernel, ...). Not a network error.
class CudaError : public ddprun::Error {
 public:
  using Error::Error;
};

// The ranks called different collectives (kind, count, element type, reduction or root) at the
// same point: a bug of the program, not of the network. The message names the ranks and calls.
class CollectiveMismatchError : public ddprun::UsageError {
 public:
  using UsageError::UsageError;
};

// A pending asynchronous collective.
class Work {
 public:
  virtual ~Work() = default;
  // gloo: blocks until the operation is done. nccl: returns at once; work the trainer queues on
  // its compute stream afterwards runs after the collective (the host does not wait for the
  // device). Throws what the collective threw, every time it is called, and on nccl as soon as
  // the watchdog saw it fail or time out.
  virtual void wait() = 0;
  // Blocks the calling thread until the operation has completed (on the device, for nccl), at
  // most for its time-out. Throws what the collective threw.
  virtual void synchronize() { wait(); }
};

struct ProcessGroupOptions {
  // Default timeout of every collective (and of connecting the group).
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // gloo: the address peers use to reach this process; empty = 127.0.0.1 when the store is on
  // loopback, else this host's name.
  std::string gloo_hostname;
  // nccl: the CUDA device; -1 = the local rank (a device that does not exist is a UsageError).
  int device = -1;
  // gloo: communication threads that asynchronous all-reduces rotate over (1-16). Several let
  // consecutive collectives (the Reducer's buckets) overlap instead of each one filling and
  // draining its ring alone.
  int gloo_threads = 3;
  // nccl: let more ranks run on this machine than it has visible GPUs (they then share devices,
  // local_rank % devices). Off (the default), that is a UsageError at creation, since NCCL
  // refuses two ranks of one communicator on one GPU unless each process has its own
  // NCCL_HOSTID. Also turned on by DDPRUN_NCCL_SHARE_DEVICES=1 (init_process_group).
  bool share_devices = false;
  // gloo: before each collective, the ranks exchange what they are about to call (kind, count,
  // element type, reduction, root, sequence number) and a mismatch throws CollectiveMismatchError
  // at once, naming the ranks and the calls. Off by default (it costs one 48-byte all-reduce per
  // collective); also turned on by DDPRUN_DISTRIBUTED_DEBUG=detail. Without it, a mismatch is
  // found when the collective times out, and named the same way.
  bool check_collectives = false;
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
  // Throws CudaError (nccl) when the device has not enough memory.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p) = 0;
  // Sets `bytes` of memory from allocate() to zero (nccl: cudaMemsetAsync on the group's stream,
  // between the compute stream's earlier and later work; the host does not wait).
  virtual void zero(void* data, std::size_t bytes) = 0;
  // Copies between host memory and memory from allocate() (a plain memcpy for gloo). nccl: on
  // the group's stream, after the compute stream's work; returns when the copy is done.
  virtual void copy_to_device(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, std::size_t bytes) = 0;
  // nccl: the CUDA stream (a cudaStream_t) the trainer computes gradients on; collectives wait
  // for the work queued on it. Ignored by gloo.
  virtual void set_compute_stream(void* stream) { (void)stream; }

  // Subgroups (tensor, pipeline or data parallel groups). Both are collectives of this group:
  // every rank calls them, in the same order as its other collectives. Each subgroup has the
  // backend, device and (unless given) options of this group, its own store keys and its own
  // communicator (nccl: ncclCommSplit; gloo: a new context under a key prefix of its own).
  //
  // split: ranks that pass the same color >= 0 form a group, ordered by key, then by rank in
  // this group; a rank passing a color < 0 (kNoColor) joins none and gets nullptr.
  static constexpr int kNoColor = -1;
  virtual std::shared_ptr<ProcessGroup> split(int color, int key, const ProcessGroupOptions& options) = 0;
  std::shared_ptr<ProcessGroup> split(int color, int key);
  // new_group: a group of `ranks` (ranks of this group, in any order, no duplicates), ordered
  // by rank; ranks not listed get nullptr. Throws UsageError for a bad list.
  std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks);
  std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks, const ProcessGroupOptions& options);
  // The options this group was created with.
  virtual const ProcessGroupOptions& options() const = 0;
};

// Creates a group of `size` ranks rendezvousing through `store` (keys under its prefix; each
// group a rank creates on one store gets keys of its own, so several groups may share a store).
// nccl: the ranks are taken to be on this machine (rank r picks device r, see
// ProcessGroupOptions::device and share_devices).
// The first call sets SIGPIPE to ignored if it had its default action (as Python does): a peer
// that died then gives an error, not a SIGPIPE death.
// backend: "gloo" or "nccl". Throws ddprun::UsageError for an unknown or unavailable backend.
std::shared_ptr<ProcessGroup> create_process_group(const std::string& backend, std::shared_ptr<rendezvous::Store> store,
                                                   int rank, int size, const ProcessGroupOptions& options = {});

// Whether the NCCL backend can be used here: this build has it, and its plugin (the one part of
// ddprun that links CUDA and NCCL, loaded on first use) loads with the CUDA and NCCL installed.
bool nccl_available();

// One call for a worker started by ddprun (or torchrun): reads the environment, connects to the
// store at MASTER_ADDR:MASTER_PORT under the prefix "ddprun/attempt_<TORCHELASTIC_RESTART_COUNT>"
// (so a restarted attempt never sees the keys of an earlier one) and creates the group. nccl:
// LOCAL_RANK picks the device; more ranks on this machine (LOCAL_WORLD_SIZE) than visible GPUs
// is a UsageError unless options.share_devices or DDPRUN_NCCL_SHARE_DEVICES=1.
std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend, const ProcessGroupOptions& options = {});
std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend, const DistEnv& env,
                                                 const ProcessGroupOptions& options = {});

}  // namespace ddprun::runtime
