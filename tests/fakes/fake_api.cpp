// The fake Api of one rank over a shared Fabric (see fake_nccl.hpp).

#include <cstdlib>
#include <cstring>
#include <random>

#include "fake_fabric.hpp"

namespace ddprun::runtime::nccl::fake {
namespace {

thread_local int t_device = 0;  // as CUDA: every thread starts on device 0

class FakeApi final : public Api {
 public:
  FakeApi(std::shared_ptr<State> s, std::shared_ptr<Fabric> f) : s_(std::move(s)), f_(std::move(f)) {}

  Fabric& fabric() { return *f_; }
  const std::shared_ptr<Fabric>& fabric_ptr() const { return f_; }

  int device_count() override { return s_->devices; }
  Status get_device(int* device) override {
    *device = t_device;
    return Status::ok();
  }
  Status set_device(int device) override {
    ++s_->set_device_calls;
    if (device < 0 || device >= s_->devices) return Status::cuda_error("invalid device ordinal");
    t_device = device;
    return Status::ok();
  }
  Status stream_create(Handle* stream) override {
    std::lock_guard<std::mutex> lock(f_->mu);
    auto* s = new Stream;
    s->device = t_device;
    f_->streams.insert(s);
    *stream = s;
    return Status::ok();
  }
  void stream_destroy(Handle stream) override {
    std::lock_guard<std::mutex> lock(f_->mu);
    f_->streams.erase(static_cast<Stream*>(stream));
    delete static_cast<Stream*>(stream);
  }
  Status malloc(void** p, std::size_t bytes) override {
    if (s_->failing_call == "cudaMalloc") return injected();
    *p = std::malloc(bytes ? bytes : 1);
    std::memset(*p, 0xAB, bytes);  // cudaMalloc does not zero
    std::lock_guard<std::mutex> lock(f_->mu);
    f_->memory[*p] = {bytes, t_device};
    ++s_->mallocs;
    return Status::ok();
  }
  void free(void* p) override {
    {
      std::lock_guard<std::mutex> lock(f_->mu);
      f_->memory.erase(p);
    }
    ++s_->frees;
    std::free(p);
  }
  Status copy_async(void* dst, const void* src, std::size_t bytes, bool, Handle stream) override {
    return queue_host(stream, "cudaMemcpyAsync", [=] { std::memcpy(dst, src, bytes); });
  }
  Status memset_async(void* p, std::size_t bytes, Handle stream) override {
    return queue_host(stream, "cudaMemsetAsync", [=] { std::memset(p, 0, bytes); });
  }
  Status cast_async(const void* in, DataType in_type, void* out, DataType out_type, std::size_t count, float scale,
                    Handle stream) override {
    ++s_->casts;
    return queue_host(stream, "cast kernel", [=] {
      for (std::size_t i = 0; i < count; ++i) {
        store(out_type, out, i, static_cast<float>(load(in_type, in, i)) * scale);
      }
    });
  }
  Status event_create(Handle* event) override {
    auto* e = new Event;
    e->device = t_device;
    *event = e;
    ++s_->events_created;
    return Status::ok();
  }
  void event_destroy(Handle event) override {
    ++s_->events_destroyed;
    delete static_cast<Event*>(event);
  }
  Status event_record(Handle event, Handle stream) override {
    std::lock_guard<std::mutex> lock(f_->mu);
    auto* s = f_->stream(stream, t_device);
    check_device("cudaEventRecord", s->device);
    auto marker = std::make_shared<Marker>();
    Op op;
    op.mark = marker;
    s->ops.push_back(std::move(op));
    static_cast<Event*>(event)->marker = marker;
    f_->pump();
    return Status::ok();
  }
  Status stream_wait_event(Handle stream, Handle event) override {
    std::lock_guard<std::mutex> lock(f_->mu);
    auto* s = f_->stream(stream, t_device);
    check_device("cudaStreamWaitEvent", s->device);
    auto marker = static_cast<Event*>(event)->marker;
    if (marker && !marker->passed) {
      Op op;
      op.wait_for = marker;
      s->ops.push_back(std::move(op));
    }
    f_->pump();
    return Status::ok();
  }
  Status event_query(Handle event) override {
    std::lock_guard<std::mutex> lock(f_->mu);
    auto* e = static_cast<Event*>(event);
    check_device("cudaEventQuery", e->device);
    return !e->marker || e->marker->passed ? Status::ok() : Status::in_progress();
  }
  Status event_synchronize(Handle event) override {
    std::unique_lock<std::mutex> lock(f_->mu);
    auto* e = static_cast<Event*>(event);
    check_device("cudaEventSynchronize", e->device);
    auto marker = e->marker;
    return f_->wait(lock, [&] { return !marker || marker->passed; }, "event");
  }
  Status unique_id(std::string* bytes) override {
    static std::mt19937_64 rng(std::random_device{}());
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    bytes->resize(128);
    for (auto& c : *bytes) c = static_cast<char>(rng());
    return Status::ok();
  }
  Status comm_init(Handle* comm, int size, const std::string& unique_id, int rank) override {
    ++s_->inits;
    std::unique_lock<std::mutex> lock(f_->mu);
    Comm* c = nullptr;
    auto s = f_->join(&c, size, unique_id, rank, t_device, lock);
    *comm = c;
    return s;
  }
  Status comm_split(Handle parent, int color, int key, Handle* child) override {
    ++s_->splits;
    std::unique_lock<std::mutex> lock(f_->mu);
    auto* p = static_cast<Comm*>(parent);
    check_device("ncclCommSplit", p->device);
    Comm* c = nullptr;
    auto s = f_->split(p, color, key, &c, lock);
    *child = c;
    return s;
  }
  Status async_error(Handle comm) override {
    std::lock_guard<std::mutex> lock(f_->mu);
    if (static_cast<Comm*>(comm)->peer_died) return Status::error("remote process exited or there was a network error");
    return Status::ok();
  }
  Status comm_destroy(Handle) override {
    ++s_->destroys;
    if (!s_->destroy_hangs) return Status::ok();
    std::unique_lock<std::mutex> lock(f_->mu);
    return f_->wait(lock, [] { return false; }, "ncclCommDestroy");
  }
  Status comm_abort(Handle comm) override {
    ++s_->aborts;
    std::lock_guard<std::mutex> lock(f_->mu);
    f_->abort(static_cast<Comm*>(comm));
    return Status::ok();
  }
  Status all_reduce(const void* in, void* out, std::size_t count, DataType type, ReduceOp op, Handle comm,
                    Handle stream) override {
    return collective({Collective::kAllReduce, in, out, count, type, op}, comm, stream);
  }
  Status broadcast(void* data, std::size_t count, DataType type, int root, Handle comm, Handle stream) override {
    Collective c{Collective::kBroadcast, data, data, count, type};
    c.root = root;
    return collective(c, comm, stream);
  }
  Status all_gather(const void* in, void* out, std::size_t count, DataType type, Handle comm, Handle stream) override {
    return collective({Collective::kAllGather, in, out, count, type}, comm, stream);
  }
  Status reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op, Handle comm,
                        Handle stream) override {
    return collective({Collective::kReduceScatter, in, out, count, type, op}, comm, stream);
  }

 private:
  void check_device(const char* call, int device) {
    if (t_device != device) {
      s_->note_wrong_device(std::string(call) + " on a thread whose device is " + std::to_string(t_device) +
                            ", for device " + std::to_string(device));
    }
  }
  Status injected() const {
    return Status::cuda_error("cudaErrorIllegalAddress: an illegal memory access was encountered");
  }
  Status queue_host(Handle stream, const char* call, std::function<void()> fn) {
    if (s_->failing_call == call) return injected();
    std::lock_guard<std::mutex> lock(f_->mu);
    auto* s = f_->stream(stream, t_device);
    check_device(call, s->device);
    Op op;
    op.host = std::move(fn);
    s->ops.push_back(std::move(op));
    f_->pump();
    return Status::ok();
  }
  Status collective(Collective c, Handle comm, Handle stream) {
    int n = s_->collectives++;
    auto it = s_->fates.find(n);
    c.fate = it == s_->fates.end() ? Fate::kComplete : it->second;
    if (c.fate == Fate::kEnqueueError) return Status::error("unhandled cuda error");
    std::unique_lock<std::mutex> lock(f_->mu);
    c.comm = static_cast<Comm*>(comm);
    if (c.comm->aborted) return Status::error("fake: communicator used after ncclCommAbort");
    if (c.fate == Fate::kCallHangs) {
      auto* cm = c.comm;
      auto s = f_->wait(lock, [cm] { return cm->aborted; }, "a collective call");
      return s.is_ok() ? Status::error("remote process exited or there was a network error (aborted)") : s;
    }
    auto* s = f_->stream(stream, t_device);
    check_device("collective", s->device);
    c.seq = c.comm->next_seq++;
    Op op;
    op.coll = std::make_shared<Collective>(c);
    s->ops.push_back(std::move(op));
    f_->pump();
    return Status::ok();
  }

  std::shared_ptr<State> s_;
  std::shared_ptr<Fabric> f_;
};

class FakeGate final : public Gate {
 public:
  FakeGate(std::shared_ptr<Fabric> f, std::shared_ptr<bool> flag) : f_(std::move(f)), flag_(std::move(flag)) {}
  ~FakeGate() override { open(); }
  void open() override {
    std::lock_guard<std::mutex> lock(f_->mu);
    *flag_ = true;
    f_->pump();
  }

 private:
  std::shared_ptr<Fabric> f_;
  std::shared_ptr<bool> flag_;
};

}  // namespace

std::shared_ptr<Api> make_api(std::shared_ptr<State> state, std::shared_ptr<Fabric> fabric) {
  return std::make_shared<FakeApi>(std::move(state), std::move(fabric));
}

void launch(Api& api, Handle stream, std::function<void()> fn) {
  auto& f = dynamic_cast<FakeApi&>(api).fabric();
  std::lock_guard<std::mutex> lock(f.mu);
  Op op;
  op.host = std::move(fn);
  f.stream(stream, t_device)->ops.push_back(std::move(op));
  f.pump();
}

std::unique_ptr<Gate> hold(Api& api, Handle stream) {
  auto& fa = dynamic_cast<FakeApi&>(api);
  auto flag = std::make_shared<bool>(false);
  {
    std::lock_guard<std::mutex> lock(fa.fabric().mu);
    Op op;
    op.gate_open = flag;
    fa.fabric().stream(stream, t_device)->ops.push_back(std::move(op));
  }
  return std::make_unique<FakeGate>(fa.fabric_ptr(), flag);
}

}  // namespace ddprun::runtime::nccl::fake
