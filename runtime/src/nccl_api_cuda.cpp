// nccl::Api on the real NCCL and CUDA runtime. Built only when CUDA and NCCL are found; every
// decision (time-outs, aborts, the broken-group rule) is in nccl_group.cpp.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>

#include "ddprun/rendezvous/store.hpp"
#include "nccl_api.hpp"
#include "nccl_unique_id.hpp"

namespace ddprun::runtime {
namespace nccl {
namespace {

Status cuda(cudaError_t e) { return e == cudaSuccess ? Status::ok() : Status::error(cudaGetErrorString(e)); }
Status from(ncclResult_t r) {
  if (r == ncclSuccess) return Status::ok();
  if (r == ncclInProgress) return Status::in_progress();
  return Status::error(ncclGetErrorString(r));
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

class CudaApi final : public Api {
 public:
  int device_count() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky error of a machine without a driver: zero devices
      return 0;
    }
    return n;
  }
  Status set_device(int device) override { return cuda(cudaSetDevice(device)); }
  Status stream_create(Handle* stream) override {
    cudaStream_t s = nullptr;
    auto st = cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *stream = s;
    return st;
  }
  void stream_destroy(Handle stream) override { cudaStreamDestroy(static_cast<cudaStream_t>(stream)); }
  Status malloc(void** p, std::size_t bytes) override {
    auto st = cuda(cudaMalloc(p, bytes));
    if (!st.is_ok()) return st;
    st = cuda(cudaMemset(*p, 0, bytes));
    if (!st.is_ok()) {
      cudaFree(*p);
      *p = nullptr;
    }
    return st;
  }
  void free(void* p) override { cudaFree(p); }
  Status copy(void* dst, const void* src, std::size_t bytes, bool to_device) override {
    return cuda(cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost));
  }
  Status event_create(Handle* event) override {
    cudaEvent_t e = nullptr;
    auto st = cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *event = e;
    return st;
  }
  void event_destroy(Handle event) override { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }
  Status event_record(Handle event, Handle stream) override {
    return cuda(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
  }
  Status stream_wait_event(Handle stream, Handle event) override {
    return cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
  }
  Status event_query(Handle event) override {
    auto e = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (e == cudaErrorNotReady) return Status::in_progress();
    return cuda(e);
  }
  Status unique_id(std::string* bytes) override {
    ncclUniqueId id;
    auto st = from(ncclGetUniqueId(&id));
    if (st.is_ok()) bytes->assign(id.internal, sizeof(id.internal));
    return st;
  }
  Status comm_init(Handle* comm, int size, const std::string& unique_id, int rank) override {
    ncclUniqueId id;
    if (unique_id.size() != sizeof(id.internal)) return Status::error("unique id of the wrong size");
    std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so that a missing peer can be timed out and aborted
    ncclComm_t c = nullptr;
    auto st = from(ncclCommInitRankConfig(&c, size, id, rank, &config));
    *comm = c;
    return st;
  }
  Status async_error(Handle comm) override {
    ncclResult_t state = ncclSuccess;
    auto st = from(ncclCommGetAsyncError(static_cast<ncclComm_t>(comm), &state));
    if (st.code == Status::kError) return st;
    return from(state);
  }
  Status comm_finalize(Handle comm) override { return from(ncclCommFinalize(static_cast<ncclComm_t>(comm))); }
  Status comm_destroy(Handle comm) override { return from(ncclCommDestroy(static_cast<ncclComm_t>(comm))); }
  Status comm_abort(Handle comm) override { return from(ncclCommAbort(static_cast<ncclComm_t>(comm))); }
  Status all_reduce(const void* in, void* out, std::size_t count, DataType type, ReduceOp op, Handle comm,
                    Handle stream) override {
    return from(ncclAllReduce(in, out, count, nccl_type(type), nccl_op(op), static_cast<ncclComm_t>(comm),
                              static_cast<cudaStream_t>(stream)));
  }
  Status broadcast(void* data, std::size_t count, DataType type, int root, Handle comm, Handle stream) override {
    return from(ncclBroadcast(data, data, count, nccl_type(type), root, static_cast<ncclComm_t>(comm),
                              static_cast<cudaStream_t>(stream)));
  }
  Status all_gather(const void* in, void* out, std::size_t count, DataType type, Handle comm, Handle stream) override {
    return from(ncclAllGather(in, out, count, nccl_type(type), static_cast<ncclComm_t>(comm),
                              static_cast<cudaStream_t>(stream)));
  }
  Status reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op, Handle comm,
                        Handle stream) override {
    return from(ncclReduceScatter(in, out, count, nccl_type(type), nccl_op(op), static_cast<ncclComm_t>(comm),
                                  static_cast<cudaStream_t>(stream)));
  }
};

}  // namespace

std::unique_ptr<Api> make_cuda_api() { return std::make_unique<CudaApi>(); }

}  // namespace nccl

std::string exchange_nccl_unique_id(rendezvous::Store& store, int rank) {
  auto api = nccl::make_cuda_api();
  return nccl::exchange_unique_id(*api, store, rank);
}

std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<rendezvous::Store> store, int rank, int size,
                                                      const ProcessGroupOptions& options, int local_rank) {
  return nccl::make_process_group(nccl::make_cuda_api(), std::move(store), rank, size, options, local_rank);
}

}  // namespace ddprun::runtime
