// The nccl backend: NCCL communicators on CUDA device memory. Built when CUDA and NCCL are found.
//
// Communicators are created non-blocking and every operation is watched against its time-out:
// a peer that died makes NCCL wait forever, so on a time-out or an asynchronous NCCL error the
// communicator is aborted (ncclCommAbort) and the call throws, rather than hang the job.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "ddprun/rendezvous/error.hpp"
#include "ddprun/rendezvous/store.hpp"
#include "ddprun/runtime/heartbeat.hpp"
#include "nccl_unique_id.hpp"
#include "process_groups.hpp"

namespace ddprun::runtime {

std::string exchange_nccl_unique_id(rendezvous::Store& store, int rank) {
  if (rank == 0) {
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) throw Error(std::string("nccl: ncclGetUniqueId failed: ") + ncclGetErrorString(r));
    std::string bytes(id.internal, sizeof(id.internal));
    store.set(kNcclUniqueIdKey, bytes);
    return bytes;
  }
  std::string bytes = store.get(kNcclUniqueIdKey);
  if (bytes.size() != sizeof(ncclUniqueId::internal)) {
    throw ProtocolError("nccl: the unique id in the store has " + std::to_string(bytes.size()) + " bytes, expected " +
                        std::to_string(sizeof(ncclUniqueId::internal)));
  }
  return bytes;
}

namespace {

using Clock = std::chrono::steady_clock;

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("nccl: ") + what + " failed: " + cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
  }
  return ncclSum;
}

class NcclProcessGroup;

// A collective enqueued on the group's stream; wait() watches it against its deadline.
class NcclWork final : public Work {
 public:
  NcclWork(NcclProcessGroup& g, cudaEvent_t done, const char* what, Clock::time_point deadline,
           std::chrono::milliseconds timeout)
      : g_(g), done_(done), what_(what), deadline_(deadline), timeout_(timeout) {}
  ~NcclWork() override;
  void wait() override;

 private:
  NcclProcessGroup& g_;
  cudaEvent_t done_;
  const char* what_;
  Clock::time_point deadline_;
  std::chrono::milliseconds timeout_;
  bool waited_ = false;
};

class NcclProcessGroup final : public ProcessGroup {
 public:
  NcclProcessGroup(std::shared_ptr<rendezvous::Store> store, int rank, int size, const ProcessGroupOptions& opt,
                   int local_rank)
      : rank_(rank), size_(size), opt_(opt) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      cudaGetLastError();  // clear the sticky error of a machine without a driver
      throw UsageError("nccl: no CUDA device is usable on this machine (rank " + std::to_string(rank) +
                       "); use the gloo backend");
    }
    device_ = opt.device >= 0 ? opt.device : local_rank % devices;
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    std::string id_bytes = exchange_nccl_unique_id(*store, rank);
    ncclUniqueId id;
    std::memcpy(id.internal, id_bytes.data(), sizeof(id.internal));
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so that a missing peer can be timed out and aborted
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      throw NetworkError(std::string("nccl: ncclCommInitRankConfig failed on rank ") + std::to_string(rank) + ": " +
                         ncclGetErrorString(r));
    }
    wait_until_ready("communicator initialisation", Clock::now() + opt.timeout, opt.timeout);
    cuda_check(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
  }

  ~NcclProcessGroup() override {
    if (comm_) {
      if (broken_) {
        ncclCommAbort(comm_);
      } else {
        ncclCommFinalize(comm_);
        ncclCommDestroy(comm_);
      }
    }
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }

  std::shared_ptr<Work> all_reduce_async(void* data, std::size_t count, DataType type, ReduceOp op,
                                         std::chrono::milliseconds timeout) override {
    return enqueue("all_reduce", timeout, [&] {
      return ncclAllReduce(data, data, count, nccl_type(type), nccl_op(op), comm_, stream_);
    });
  }
  void broadcast(void* data, std::size_t count, DataType type, int root, std::chrono::milliseconds timeout) override {
    enqueue("broadcast", timeout, [&] {
      return ncclBroadcast(data, data, count, nccl_type(type), root, comm_, stream_);
    })->wait();
  }
  void all_gather(const void* in, void* out, std::size_t count, DataType type, std::chrono::milliseconds timeout) override {
    enqueue("all_gather", timeout, [&] { return ncclAllGather(in, out, count, nccl_type(type), comm_, stream_); })->wait();
  }
  void reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                      std::chrono::milliseconds timeout) override {
    enqueue("reduce_scatter", timeout, [&] {
      return ncclReduceScatter(in, out, count, nccl_type(type), nccl_op(op), comm_, stream_);
    })->wait();
  }
  void barrier(std::chrono::milliseconds timeout) override {
    enqueue("barrier", timeout, [&] {
      return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_);
    })->wait();
  }

  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    cuda_check(cudaMemset(p, 0, bytes ? bytes : 1), "cudaMemset");
    return p;
  }
  void deallocate(void* p) override { cudaFree(p); }
  void copy_to_device(void* dst, const void* src, std::size_t bytes) override {
    cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  }
  void set_compute_stream(void* stream) override { compute_ = static_cast<cudaStream_t>(stream); }

  // Waits for `done` or a NCCL error, until the deadline; aborts the communicator on either.
  void watch(cudaEvent_t done, const char* what, Clock::time_point deadline, std::chrono::milliseconds timeout) {
    for (;;) {
      cudaError_t q = cudaEventQuery(done);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) {
        fail(std::string("nccl: ") + what + " on rank " + std::to_string(rank_) + ": CUDA error " + cudaGetErrorString(q));
      }
      check_async(what);
      if (Clock::now() > deadline) {
        broken_ = true;
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw TimeoutError("nccl: " + std::string(what) + " on rank " + std::to_string(rank_) + " of " +
                           std::to_string(size_) + " timed out after " + seconds_text(timeout) +
                           " (a peer may have died or stalled); the communicator was aborted");
      }
      // NCCL reports progress only through polling; 200 us keeps latency low at little cost.
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    // Later work on the trainer's stream runs after the collective.
    cuda_check(cudaStreamWaitEvent(compute_, done, 0), "cudaStreamWaitEvent");
    heartbeat();
  }

 private:
  template <typename F>
  std::shared_ptr<Work> enqueue(const char* what, std::chrono::milliseconds timeout, F&& call) {
    if (broken_ || !comm_) throw NetworkError(std::string("nccl: ") + what + ": the communicator was aborted earlier");
    auto t = timeout.count() < 0 ? opt_.timeout : timeout;
    auto deadline = Clock::now() + t;
    cudaEvent_t ready, done;
    cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    // The collective starts after the gradients the trainer queued on its stream.
    cuda_check(cudaEventRecord(ready, compute_), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(ready);
    ncclResult_t r = call();
    if (r == ncclInProgress) {
      wait_until_ready(what, deadline, t);
    } else if (r != ncclSuccess) {
      fail(std::string("nccl: ") + what + " on rank " + std::to_string(rank_) + " failed: " + ncclGetErrorString(r));
    }
    cuda_check(cudaEventRecord(done, stream_), "cudaEventRecord");
    return std::make_shared<NcclWork>(*this, done, what, deadline, t);
  }

  void wait_until_ready(const char* what, Clock::time_point deadline, std::chrono::milliseconds timeout) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        fail(std::string("nccl: ") + what + " on rank " + std::to_string(rank_) + " failed: " + ncclGetErrorString(state));
      }
      if (Clock::now() > deadline) {
        broken_ = true;
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw TimeoutError(std::string("nccl: ") + what + " on rank " + std::to_string(rank_) + " of " +
                           std::to_string(size_) + " timed out after " + seconds_text(timeout) +
                           " (are all ranks running?); the communicator was aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  void check_async(const char* what) {
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      fail(std::string("nccl: ") + what + " on rank " + std::to_string(rank_) + ": " + ncclGetErrorString(state) +
           " (a peer may have died)");
    }
  }

  [[noreturn]] void fail(const std::string& msg) {
    broken_ = true;
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw NetworkError(msg + "; the communicator was aborted");
  }

  int rank_, size_;
  ProcessGroupOptions opt_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaStream_t compute_ = nullptr;  // the legacy default stream unless the trainer sets one
  void* scratch_ = nullptr;
  bool broken_ = false;
};

NcclWork::~NcclWork() { cudaEventDestroy(done_); }

void NcclWork::wait() {
  if (waited_) return;
  waited_ = true;
  g_.watch(done_, what_, deadline_, timeout_);
}

}  // namespace

std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<rendezvous::Store> store, int rank, int size,
                                                      const ProcessGroupOptions& options, int local_rank) {
  return std::make_shared<NcclProcessGroup>(std::move(store), rank, size, options, local_rank);
}

}  // namespace ddprun::runtime
