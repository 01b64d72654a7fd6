// nccl::Api on the real NCCL and CUDA runtime: the plugin libddprun-runtime-nccl.so, which
// ddprun::runtime loads at run time (nccl_loader.cpp) when a program asks for the nccl backend,
// so that programs on the gloo backend need no CUDA or NCCL library. Built only when CUDA and
// NCCL are found; every decision (time-outs, aborts, the broken-group rule) is in nccl_core.cpp
// and nccl_group.cpp.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>

#include "nccl_api.hpp"
#include "nccl_cast.hpp"

namespace ddprun::runtime {
namespace nccl {
namespace {

Status cuda(cudaError_t e) {
  if (e == cudaSuccess) return Status::ok();
  return Status::cuda_error(std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e));
}
Status from(ncclResult_t r, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return Status::ok();
  if (r == ncclInProgress) return Status::in_progress();
  std::string msg = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) msg += std::string(" (") + last + ")";
  if (r == ncclUnhandledCudaError) return Status::cuda_error(msg);
  return Status::error(msg);
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

cudaStream_t S(Handle h) { return static_cast<cudaStream_t>(h); }
cudaEvent_t E(Handle h) { return static_cast<cudaEvent_t>(h); }
ncclComm_t C(Handle h) { return static_cast<ncclComm_t>(h); }

class CudaApi final : public Api {
 public:
  int device_count() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the error of a machine without a driver: zero devices
      return 0;
    }
    return n;
  }
  Status get_device(int* device) override { return cuda(cudaGetDevice(device)); }
  Status set_device(int device) override { return cuda(cudaSetDevice(device)); }
  Status stream_create(Handle* stream) override {
    cudaStream_t s = nullptr;
    auto st = cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *stream = s;
    return st;
  }
  void stream_destroy(Handle stream) override { cudaStreamDestroy(S(stream)); }
  Status malloc(void** p, std::size_t bytes) override { return cuda(cudaMalloc(p, bytes)); }
  void free(void* p) override { cudaFree(p); }
  Status copy_async(void* dst, const void* src, std::size_t bytes, bool to_device, Handle stream) override {
    return cuda(cudaMemcpyAsync(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, S(stream)));
  }
  Status memset_async(void* p, std::size_t bytes, Handle stream) override {
    return cuda(cudaMemsetAsync(p, 0, bytes, S(stream)));
  }
  Status cast_async(const void* in, DataType in_type, void* out, DataType out_type, std::size_t count, float scale,
                    Handle stream) override {
    return launch_cast(in, in_type, out, out_type, count, scale, S(stream));
  }
  Status event_create(Handle* event) override {
    cudaEvent_t e = nullptr;
    auto st = cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *event = e;
    return st;
  }
  void event_destroy(Handle event) override { cudaEventDestroy(E(event)); }
  Status event_record(Handle event, Handle stream) override { return cuda(cudaEventRecord(E(event), S(stream))); }
  Status stream_wait_event(Handle stream, Handle event) override {
    return cuda(cudaStreamWaitEvent(S(stream), E(event), 0));
  }
  Status event_query(Handle event) override {
    auto e = cudaEventQuery(E(event));
    if (e == cudaErrorNotReady) return Status::in_progress();
    return cuda(e);
  }
  Status event_synchronize(Handle event) override { return cuda(cudaEventSynchronize(E(event))); }
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
    // Blocking: a collective is enqueued by the call itself. (A non-blocking communicator
    // makes NCCL 2.28 start a thread for every collective and answer ncclInProgress.)
    config.blocking = 1;
    ncclComm_t c = nullptr;
    auto st = from(ncclCommInitRankConfig(&c, size, id, rank, &config));
    *comm = c;
    return st;
  }
  Status comm_split(Handle parent, int color, int key, Handle* child) override {
    ncclComm_t c = nullptr;
    auto st = from(ncclCommSplit(C(parent), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &c, nullptr), C(parent));
    *child = c;
    return st;
  }
  Status async_error(Handle comm) override {
    ncclResult_t state = ncclSuccess;
    auto st = from(ncclCommGetAsyncError(C(comm), &state));
    if (!st.is_ok()) return st;
    return from(state, C(comm));
  }
  Status comm_destroy(Handle comm) override { return from(ncclCommDestroy(C(comm))); }
  Status comm_abort(Handle comm) override { return from(ncclCommAbort(C(comm))); }
  Status all_reduce(const void* in, void* out, std::size_t count, DataType type, ReduceOp op, Handle comm,
                    Handle stream) override {
    return from(ncclAllReduce(in, out, count, nccl_type(type), nccl_op(op), C(comm), S(stream)), C(comm));
  }
  Status broadcast(void* data, std::size_t count, DataType type, int root, Handle comm, Handle stream) override {
    return from(ncclBroadcast(data, data, count, nccl_type(type), root, C(comm), S(stream)), C(comm));
  }
  Status all_gather(const void* in, void* out, std::size_t count, DataType type, Handle comm, Handle stream) override {
    return from(ncclAllGather(in, out, count, nccl_type(type), C(comm), S(stream)), C(comm));
  }
  Status reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op, Handle comm,
                        Handle stream) override {
    return from(ncclReduceScatter(in, out, count, nccl_type(type), nccl_op(op), C(comm), S(stream)), C(comm));
  }
};

}  // namespace

}  // namespace nccl
}  // namespace ddprun::runtime

// The plugin's one entry point (nccl_loader.cpp finds it with dlsym): a new Api on the real
// CUDA and NCCL, owned by the caller. Only this library links libnccl and libcudart.
extern "C" __attribute__((visibility("default"))) ddprun::runtime::nccl::Api* ddprun_runtime_nccl_api_v1() {
  return new ddprun::runtime::nccl::CudaApi();  // (this file's anonymous namespace)
}
