// The nccl process group: the public operations over the core (nccl_core.hpp), its creation
// and its subgroups. Every operation sets the group's device on the calling thread first and
// puts the thread's own device back before returning.

#include "nccl_group.hpp"

#include <cstdlib>

#include "bounded_call.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/rendezvous/prefix_store.hpp"
#include "ddprun/rendezvous/store.hpp"
#include "device_compression.hpp"
#include "group_keys.hpp"
#include "nccl_core.hpp"
#include "nccl_unique_id.hpp"
#include "process_groups.hpp"

namespace ddprun::runtime::nccl {

std::string exchange_unique_id(Api& api, rendezvous::Store& store, int rank) {
  std::string bytes;
  if (rank == 0) {
    auto s = api.unique_id(&bytes);
    if (!s.is_ok()) throw NetworkError("nccl: ncclGetUniqueId failed: " + s.message);
    store.set(kNcclUniqueIdKey, bytes);
    return bytes;
  }
  bytes = store.get(kNcclUniqueIdKey);
  std::size_t expected = 128;  // sizeof(ncclUniqueId)
  if (bytes.size() != expected) {
    throw ProtocolError("nccl: the unique id in the store has " + std::to_string(bytes.size()) + " bytes, expected " +
                        std::to_string(expected));
  }
  return bytes;
}

int choose_device(int devices, const ProcessGroupOptions& options, Placement placement, int rank) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string seen = std::to_string(devices) + " visible CUDA device(s)" +
                           (visible ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")" : std::string());
  if (options.device >= 0) {
    if (options.device >= devices) {
      throw UsageError("nccl: rank " + std::to_string(rank) + " asks for device " + std::to_string(options.device) +
                       " (ProcessGroupOptions::device) but this machine has " + seen);
    }
    return options.device;
  }
  if (placement.local_size > devices && !options.share_devices) {
    throw UsageError("nccl: " + std::to_string(placement.local_size) + " ranks run on this machine but it has " + seen +
                     " (rank " + std::to_string(rank) + ", local rank " + std::to_string(placement.local_rank) +
                     "): NCCL wants a GPU per rank. Start at most " + std::to_string(devices) +
                     " ranks per node, or let ranks share GPUs with ProcessGroupOptions::share_devices or "
                     "DDPRUN_NCCL_SHARE_DEVICES=1 (then each process needs its own NCCL_HOSTID)");
  }
  return placement.local_rank % devices;
}

namespace {

std::string rank_text(int rank, int size) { return "rank " + std::to_string(rank) + " of " + std::to_string(size); }

// ncclCommInitRankConfig, bounded by the time-out (bounded_call.hpp).
Handle init_comm(const std::shared_ptr<Api>& api, int device, int rank, int size, const std::string& id,
                 std::chrono::milliseconds timeout) {
  using Result = std::pair<Status, Handle>;
  auto r = run_bounded<Result>(
      [api, device, rank, size, id] {
        Handle comm = nullptr;
        auto s = api->set_device(device);
        if (s.is_ok()) s = api->comm_init(&comm, size, id, rank);
        return Result{s, comm};
      },
      Clock::now() + timeout,
      [api](Result& late) {
        if (late.second) api->comm_abort(late.second);  // nobody will use it
      });
  if (!r) {
    throw TimeoutError("nccl: communicator initialisation on " + rank_text(rank, size) + " timed out after " +
                       seconds_text(timeout) + " (are all ranks running and creating this group?)");
  }
  if (!r->first.is_ok()) {
    if (r->second) api->comm_abort(r->second);
    std::string msg = "nccl: ncclCommInitRankConfig failed on device " + std::to_string(device) + " (" +
                      rank_text(rank, size) + "): " + r->first.message;
    if (r->first.code == Status::kCudaError) throw CudaError(msg);
    if (r->first.message.find("invalid usage") != std::string::npos) {
      msg += " (NCCL refuses two ranks of one communicator on one GPU unless each process has its own NCCL_HOSTID)";
    }
    throw NetworkError(msg);
  }
  return r->second;
}

class Group final : public ProcessGroup, public DeviceCompression {
 public:
  Group(std::shared_ptr<Core> core, std::shared_ptr<rendezvous::Store> store, ProcessGroupOptions opt)
      : core_(std::move(core)), api_(core_->api()), store_(std::move(store)), opt_(std::move(opt)) {
    DeviceGuard guard(api_, core_->device());
    scratch_ = allocate(sizeof(float));
  }
  ~Group() override {
    try {
      DeviceGuard guard(api_, core_->device());
      core_->shutdown();
      if (scratch_) api_.free(scratch_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ddprun: nccl: rank %d: destroying the group: %s\n", core_->rank(), e.what());
    }
  }

  int rank() const override { return core_->rank(); }
  int size() const override { return core_->size(); }
  const char* backend() const override { return "nccl"; }
  const ProcessGroupOptions& options() const override { return opt_; }
  using ProcessGroup::split;

  std::shared_ptr<Work> all_reduce_async(void* data, std::size_t count, DataType type, ReduceOp op,
                                         std::chrono::milliseconds timeout) override {
    DeviceGuard guard(api_, core_->device());
    return core_->enqueue("all_reduce", timeout, [&](Handle comm, Handle stream) {
      return CallResult::of(api_.all_reduce(data, data, count, type, op, comm, stream), "ncclAllReduce");
    });
  }
  void broadcast(void* data, std::size_t count, DataType type, int root, std::chrono::milliseconds timeout) override {
    if (root < 0 || root >= size()) {
      throw UsageError("broadcast: root " + std::to_string(root) + " is not a rank of a group of " + std::to_string(size()));
    }
    DeviceGuard guard(api_, core_->device());
    core_->enqueue("broadcast", timeout, [&](Handle comm, Handle stream) {
      return CallResult::of(api_.broadcast(data, count, type, root, comm, stream), "ncclBroadcast");
    })->wait();
  }
  void all_gather(const void* in, void* out, std::size_t count, DataType type, std::chrono::milliseconds timeout) override {
    DeviceGuard guard(api_, core_->device());
    core_->enqueue("all_gather", timeout, [&](Handle comm, Handle stream) {
      return CallResult::of(api_.all_gather(in, out, count, type, comm, stream), "ncclAllGather");
    })->wait();
  }
  void reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                      std::chrono::milliseconds timeout) override {
    DeviceGuard guard(api_, core_->device());
    core_->enqueue("reduce_scatter", timeout, [&](Handle comm, Handle stream) {
      return CallResult::of(api_.reduce_scatter(in, out, count, type, op, comm, stream), "ncclReduceScatter");
    })->wait();
  }
  // Blocks the host (PyTorch's barrier does too): every rank got here and the group's work
  // issued before it is done.
  void barrier(std::chrono::milliseconds timeout) override {
    DeviceGuard guard(api_, core_->device());
    core_->enqueue("barrier", timeout, [&](Handle comm, Handle stream) {
      return CallResult::of(api_.all_reduce(scratch_, scratch_, 1, DataType::kFloat32, ReduceOp::kSum, comm, stream),
                            "ncclAllReduce");
    })->synchronize();
  }

  void* allocate(std::size_t bytes) override {
    DeviceGuard guard(api_, core_->device());
    void* p = nullptr;
    auto s = api_.malloc(&p, bytes ? bytes : 1);
    if (!s.is_ok()) {
      throw CudaError(core_->call_failure(("allocating " + std::to_string(bytes) + " bytes").c_str(),
                                          CallResult::of(s, "cudaMalloc")));
    }
    try {
      zero(p, bytes);
    } catch (...) {
      api_.free(p);
      throw;
    }
    return p;
  }
  void deallocate(void* p) override {
    DeviceGuard guard(api_, core_->device());
    api_.free(p);
  }
  void zero(void* data, std::size_t bytes) override {
    DeviceGuard guard(api_, core_->device());
    core_->stream_op("zero", false, [&](Handle stream) {
      return CallResult::of(api_.memset_async(data, bytes, stream), "cudaMemsetAsync");
    });
  }
  void copy_to_device(void* dst, const void* src, std::size_t bytes) override {
    DeviceGuard guard(api_, core_->device());
    core_->stream_op("copy_to_device", true, [&](Handle stream) {
      return CallResult::of(api_.copy_async(dst, src, bytes, true, stream), "cudaMemcpyAsync");
    });
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    DeviceGuard guard(api_, core_->device());
    core_->stream_op("copy_to_host", true, [&](Handle stream) {
      return CallResult::of(api_.copy_async(dst, src, bytes, false, stream), "cudaMemcpyAsync");
    });
  }
  void set_compute_stream(void* stream) override { core_->set_compute_stream(stream); }

  std::shared_ptr<ProcessGroup> split(int color, int key, const ProcessGroupOptions& options) override;

  std::shared_ptr<Work> all_reduce_compressed_async(float* data, std::size_t count, DataType wire,
                                                    void* scratch) override {
    DeviceGuard guard(api_, core_->device());
    const float scale = 1.0f / static_cast<float>(size());
    return core_->enqueue("all_reduce (compressed)", kDefaultTimeout, [&](Handle comm, Handle stream) {
      auto r = CallResult::of(api_.cast_async(data, DataType::kFloat32, scratch, wire, count, scale, stream), "cast kernel");
      if (r.status.is_ok()) {
        r = CallResult::of(api_.all_reduce(scratch, scratch, count, wire, ReduceOp::kSum, comm, stream), "ncclAllReduce");
      }
      if (r.status.is_ok()) {
        r = CallResult::of(api_.cast_async(scratch, wire, data, DataType::kFloat32, count, 1.0f, stream), "cast kernel");
      }
      return r;
    });
  }

 private:
  // ---- constant after construction
  std::shared_ptr<Core> core_;
  Api& api_;
  std::shared_ptr<rendezvous::Store> store_;  // this group's keys
  ProcessGroupOptions opt_;
  void* scratch_ = nullptr;  // barrier's one float
  // ---- the thread using the group
  int splits_ = 0;
};

std::shared_ptr<ProcessGroup> Group::split(int color, int key, const ProcessGroupOptions& options) {
  DeviceGuard guard(api_, core_->device());
  auto plan = agree_split(*store_, ++splits_, rank(), size(), color, key, opt_.timeout);
  // Every rank takes part in ncclCommSplit, those without a color too; NCCL orders ranks as
  // agree_split does (key, then rank).
  Handle child = core_->split(plan ? color : -1, key, opt_.timeout);
  if (!plan) return nullptr;
  if (!child) throw NetworkError("nccl: ncclCommSplit gave no communicator to " + rank_text(rank(), size()));
  auto core = Core::create({core_->api_shared(), plan->rank, plan->size, core_->device(), options.timeout, child});
  return std::make_shared<Group>(core, std::make_shared<rendezvous::PrefixStore>(plan->prefix, store_), options);
}

}  // namespace

std::shared_ptr<ProcessGroup> make_process_group(std::shared_ptr<Api> api, std::shared_ptr<rendezvous::Store> store,
                                                 int rank, int size, const ProcessGroupOptions& options,
                                                 Placement placement) {
  int devices = api->device_count();
  if (devices <= 0) {
    throw UsageError("nccl: no CUDA device is usable on this machine (rank " + std::to_string(rank) +
                     "); use the gloo backend");
  }
  const int device = choose_device(devices, options, placement, rank);
  DeviceGuard guard(*api, device);
  std::string id = exchange_unique_id(*api, *store, rank);
  Handle comm = init_comm(api, device, rank, size, id, options.timeout);
  auto core = Core::create({api, rank, size, device, options.timeout, comm});
  return std::make_shared<Group>(core, std::move(store), options);
}

}  // namespace ddprun::runtime::nccl
