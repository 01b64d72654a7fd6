// The nccl backend's state machine, on the nccl::Api seam (nccl_api.hpp): NCCL communicators on
// device memory, created non-blocking so that every operation can be watched against its
// time-out. A peer that died makes NCCL wait forever, so on a time-out or an asynchronous NCCL
// error the communicator is aborted and the call throws, rather than hang the job.
//
// Failure rules (both backends): every wait() of a failed operation rethrows its error, every
// time; after any failed or timed-out operation the group is broken and every later call fails at
// once, naming the first cause; operations still pending when the group broke fail too (their
// events will never be reached after an abort). Teardown finalizes the communicator, polled to
// completion within the group's time-out, and aborts it when that runs out or it fails.

#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "ddprun/common/error.hpp"
#include "ddprun/rendezvous/store.hpp"
#include "ddprun/runtime/heartbeat.hpp"
#include "nccl_api.hpp"
#include "nccl_unique_id.hpp"
#include "process_groups.hpp"

namespace ddprun::runtime::nccl {

std::string exchange_unique_id(Api& api, rendezvous::Store& store, int rank) {
  std::string bytes;
  if (rank == 0) {
    auto s = api.unique_id(&bytes);
    if (!s.is_ok()) throw Error("nccl: ncclGetUniqueId failed: " + s.message);
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

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::microseconds(200);  // NCCL reports progress only when polled

class Group;

// A collective enqueued on the group's stream; wait() watches it against its deadline.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Group> g, Handle done, const char* what, Clock::time_point deadline,
           std::chrono::milliseconds timeout)
      : g_(std::move(g)), done_(done), what_(what), deadline_(deadline), timeout_(timeout) {}
  ~NcclWork() override;
  void wait() override;

 private:
  std::shared_ptr<Group> g_;
  Handle done_;
  const char* what_;
  Clock::time_point deadline_;
  std::chrono::milliseconds timeout_;
  bool completed_ = false;
  std::exception_ptr error_;  // rethrown by every wait() after a failure
};

// An event destroyed unless released: no event leaks when enqueueing fails half-way.
struct EventGuard {
  Api& api;
  Handle event = nullptr;
  ~EventGuard() {
    if (event) api.event_destroy(event);
  }
  Handle release() {
    Handle e = event;
    event = nullptr;
    return e;
  }
};

class Group final : public ProcessGroup, public std::enable_shared_from_this<Group> {
 public:
  Group(std::unique_ptr<Api> api, std::shared_ptr<rendezvous::Store> store, int rank, int size,
        const ProcessGroupOptions& opt, int local_rank)
      : api_(std::move(api)), rank_(rank), size_(size), opt_(opt) {
    int devices = api_->device_count();
    if (devices <= 0) {
      throw UsageError("nccl: no CUDA device is usable on this machine (rank " + std::to_string(rank) +
                       "); use the gloo backend");
    }
    try {
      device_ = opt.device >= 0 ? opt.device : local_rank % devices;
      check(api_->set_device(device_), "cudaSetDevice");
      std::string id = exchange_unique_id(*api_, *store, rank);
      check(api_->stream_create(&stream_), "cudaStreamCreate");
      auto s = api_->comm_init(&comm_, size, id, rank);
      if (s.code == Status::kError) {
        throw NetworkError("nccl: ncclCommInitRankConfig failed on rank " + std::to_string(rank) + ": " + s.message);
      }
      wait_until_ready("communicator initialisation", Clock::now() + opt.timeout, opt.timeout);
      check(api_->malloc(&scratch_, sizeof(float)), "cudaMalloc");
    } catch (...) {
      teardown();
      throw;
    }
  }

  ~Group() override { teardown(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }

  std::shared_ptr<Work> all_reduce_async(void* data, std::size_t count, DataType type, ReduceOp op,
                                         std::chrono::milliseconds timeout) override {
    return enqueue("all_reduce", timeout, [&] { return api_->all_reduce(data, data, count, type, op, comm_, stream_); });
  }
  void broadcast(void* data, std::size_t count, DataType type, int root, std::chrono::milliseconds timeout) override {
    if (root < 0 || root >= size_) {
      throw UsageError("broadcast: root " + std::to_string(root) + " is not a rank of a group of " + std::to_string(size_));
    }
    enqueue("broadcast", timeout, [&] { return api_->broadcast(data, count, type, root, comm_, stream_); })->wait();
  }
  void all_gather(const void* in, void* out, std::size_t count, DataType type, std::chrono::milliseconds timeout) override {
    enqueue("all_gather", timeout, [&] { return api_->all_gather(in, out, count, type, comm_, stream_); })->wait();
  }
  void reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                      std::chrono::milliseconds timeout) override {
    enqueue("reduce_scatter", timeout,
            [&] { return api_->reduce_scatter(in, out, count, type, op, comm_, stream_); })->wait();
  }
  void barrier(std::chrono::milliseconds timeout) override {
    enqueue("barrier", timeout, [&] {
      return api_->all_reduce(scratch_, scratch_, 1, DataType::kFloat32, ReduceOp::kSum, comm_, stream_);
    })->wait();
  }

  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    check(api_->malloc(&p, bytes ? bytes : 1), "cudaMalloc");
    return p;
  }
  void deallocate(void* p) override { api_->free(p); }
  void copy_to_device(void* dst, const void* src, std::size_t bytes) override {
    check(api_->copy(dst, src, bytes, true), "cudaMemcpy to device");
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    check(api_->copy(dst, src, bytes, false), "cudaMemcpy to host");
  }
  void set_compute_stream(void* stream) override { compute_ = stream; }

  // Waits for `done` or a NCCL error, until the deadline; aborts the communicator on either.
  void watch(Handle done, const char* what, Clock::time_point deadline, std::chrono::milliseconds timeout) {
    std::lock_guard<std::mutex> lock(mu_);
    for (;;) {
      auto q = api_->event_query(done);
      if (q.code == Status::kSuccess) break;
      if (q.code == Status::kError) fail(std::string(what) + ": CUDA error " + q.message);
      // The group broke (another operation failed and aborted the communicator): this event
      // will never be reached.
      if (failure_) throw_earlier(what);
      check_async(what);
      if (Clock::now() > deadline) fail_timeout(what, timeout, " (a peer may have died or stalled)");
      std::this_thread::sleep_for(kPoll);
    }
    // Later work on the trainer's stream runs after the collective.
    check(api_->stream_wait_event(compute_, done), "cudaStreamWaitEvent");
    heartbeat();
  }

  Api& api() { return *api_; }

 private:
  template <typename F>
  std::shared_ptr<Work> enqueue(const char* what, std::chrono::milliseconds timeout, F&& call) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_) throw_earlier(what);
    auto t = timeout.count() < 0 ? opt_.timeout : timeout;
    auto deadline = Clock::now() + t;
    EventGuard ready{*api_}, done{*api_};
    check(api_->event_create(&ready.event), "cudaEventCreate");
    check(api_->event_create(&done.event), "cudaEventCreate");
    // The collective starts after the gradients the trainer queued on its stream.
    check(api_->event_record(ready.event, compute_), "cudaEventRecord");
    check(api_->stream_wait_event(stream_, ready.event), "cudaStreamWaitEvent");
    auto r = call();
    if (r.code == Status::kInProgress) {
      wait_until_ready(what, deadline, t);
    } else if (r.code == Status::kError) {
      fail(std::string(what) + " failed: " + r.message);
    }
    check(api_->event_record(done.event, stream_), "cudaEventRecord");
    return std::make_shared<NcclWork>(shared_from_this(), done.release(), what, deadline, t);
  }

  void wait_until_ready(const char* what, Clock::time_point deadline, std::chrono::milliseconds timeout) {
    for (;;) {
      auto s = api_->async_error(comm_);
      if (s.code == Status::kSuccess) return;
      if (s.code == Status::kError) fail(std::string(what) + " failed: " + s.message);
      if (Clock::now() > deadline) fail_timeout(what, timeout, " (are all ranks running?)");
      std::this_thread::sleep_for(kPoll);
    }
  }

  void check_async(const char* what) {
    auto s = api_->async_error(comm_);
    if (s.code == Status::kError) fail(std::string(what) + ": " + s.message + " (a peer may have died)");
  }

  // A failed CUDA call: the group cannot be trusted any more either.
  void check(const Status& s, const char* call) {
    if (s.code == Status::kError) fail(std::string(call) + " failed: " + s.message);
  }

  void abort_comm() {
    if (comm_) api_->comm_abort(comm_);
    comm_ = nullptr;
  }

  [[noreturn]] void fail(const std::string& what) {
    std::string msg = "nccl: " + what + " on rank " + std::to_string(rank_) + "; the communicator was aborted";
    abort_comm();
    auto e = std::make_exception_ptr(NetworkError(msg));
    if (!failure_) {
      failure_ = e;
      cause_ = msg;
    }
    std::rethrow_exception(e);
  }
  [[noreturn]] void fail_timeout(const char* what, std::chrono::milliseconds timeout, const char* hint) {
    std::string msg = "nccl: " + std::string(what) + " on rank " + std::to_string(rank_) + " of " +
                      std::to_string(size_) + " timed out after " + seconds_text(timeout) + hint +
                      "; the communicator was aborted";
    abort_comm();
    auto e = std::make_exception_ptr(TimeoutError(msg));
    if (!failure_) {
      failure_ = e;
      cause_ = msg;
      cause_is_timeout_ = true;
    }
    std::rethrow_exception(e);
  }
  [[noreturn]] void throw_earlier(const char* what) {
    std::string msg = "nccl: " + std::string(what) + " on rank " + std::to_string(rank_) +
                      ": the process group failed earlier: " + cause_;
    if (cause_is_timeout_) throw TimeoutError(msg);
    throw NetworkError(msg);
  }

  // Finalize (flushes what was issued) polled to completion within the time-out, then destroy;
  // abort instead when the group failed, finalize fails, or the time runs out. Never throws.
  void teardown() {
    if (comm_) {
      bool clean = !failure_;
      if (clean) {
        auto s = api_->comm_finalize(comm_);
        auto deadline = Clock::now() + opt_.timeout;
        while (s.code == Status::kSuccess || s.code == Status::kInProgress) {
          s = api_->async_error(comm_);
          if (s.code == Status::kSuccess) break;
          if (s.code == Status::kInProgress && Clock::now() > deadline) {
            std::fprintf(stderr, "ddprun: nccl: rank %d: ncclCommFinalize did not complete within %s; aborting\n",
                         rank_, seconds_text(opt_.timeout).c_str());
            s = Status::error("time-out");
            break;
          }
          std::this_thread::sleep_for(kPoll);
        }
        if (s.code == Status::kError) {
          if (s.message != "time-out") {
            std::fprintf(stderr, "ddprun: nccl: rank %d: ncclCommFinalize failed (%s); aborting\n", rank_,
                         s.message.c_str());
          }
          clean = false;
        }
      }
      if (clean) {
        api_->comm_destroy(comm_);
      } else {
        api_->comm_abort(comm_);
      }
      comm_ = nullptr;
    }
    if (scratch_) api_->free(scratch_);
    scratch_ = nullptr;
    if (stream_) api_->stream_destroy(stream_);
    stream_ = nullptr;
  }

  std::unique_ptr<Api> api_;
  int rank_, size_;
  ProcessGroupOptions opt_;
  int device_ = 0;
  Handle comm_ = nullptr;
  Handle stream_ = nullptr;
  Handle compute_ = nullptr;  // the legacy default stream unless the trainer sets one
  void* scratch_ = nullptr;
  std::mutex mu_;                    // enqueue and watch may come from different threads
  std::exception_ptr failure_;       // the first failure: the group is broken from then on
  std::string cause_;
  bool cause_is_timeout_ = false;
};

NcclWork::~NcclWork() { g_->api().event_destroy(done_); }

void NcclWork::wait() {
  if (completed_) return;
  if (error_) std::rethrow_exception(error_);
  try {
    g_->watch(done_, what_, deadline_, timeout_);
    completed_ = true;
  } catch (...) {
    error_ = std::current_exception();
    throw;
  }
}

}  // namespace

std::shared_ptr<ProcessGroup> make_process_group(std::unique_ptr<Api> api, std::shared_ptr<rendezvous::Store> store,
                                                 int rank, int size, const ProcessGroupOptions& options,
                                                 int local_rank) {
  return std::make_shared<Group>(std::move(api), std::move(store), rank, size, options, local_rank);
}

}  // namespace ddprun::runtime::nccl
