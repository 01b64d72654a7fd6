#include "fake_nccl.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace ddprun::runtime::nccl::fake {
namespace {

struct FakeEvent {
  bool reached = false;
  int collective = -1;
};

class FakeNccl final : public Api {
 public:
  explicit FakeNccl(std::shared_ptr<State> s) : s_(std::move(s)) {}
  ~FakeNccl() override { join_launch(); }

  int device_count() override { return 1; }
  Status set_device(int) override { return Status::ok(); }
  Status stream_create(Handle* stream) override {
    *stream = &group_stream_;
    return Status::ok();
  }
  void stream_destroy(Handle) override {}
  Status malloc(void** p, std::size_t bytes) override {
    *p = std::calloc(1, bytes);
    ++s_->mallocs;
    return Status::ok();
  }
  void free(void* p) override {
    ++s_->frees;
    std::free(p);
  }
  Status copy(void* dst, const void* src, std::size_t bytes, bool) override {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  Status event_create(Handle* event) override {
    *event = new FakeEvent;
    ++s_->events_created;
    s_->live_events.insert(*event);
    return Status::ok();
  }
  void event_destroy(Handle event) override {
    ++s_->events_destroyed;
    s_->live_events.erase(event);
    delete static_cast<FakeEvent*>(event);
  }
  Status event_record(Handle event, Handle stream) override {
    auto* e = static_cast<FakeEvent*>(event);
    if (stream != &group_stream_) {
      e->reached = true;  // the trainer's stream: nothing pending
      return Status::ok();
    }
    e->collective = s_->collectives - 1;
    auto fate = fate_of(e->collective);
    e->reached = fate == Fate::kComplete;
    if (fate == Fate::kPeerDies) s_->peer_died = true;
    return Status::ok();
  }
  Status stream_wait_event(Handle, Handle) override { return Status::ok(); }
  Status event_query(Handle event) override {
    return static_cast<FakeEvent*>(event)->reached ? Status::ok() : Status::in_progress();
  }
  Status unique_id(std::string* bytes) override {
    bytes->assign(128, 'u');
    return Status::ok();
  }
  Status comm_init(Handle* comm, int, const std::string&, int) override {
    *comm = &comm_;
    return Status::in_progress();  // non-blocking: ready at the first poll
  }
  Status async_error(Handle) override {
    if (s_->peer_died) return Status::error("remote process exited or there was a network error");
    if (launching_) {
      if (!launched_.load(std::memory_order_acquire)) return Status::in_progress();
      join_launch();
    }
    if (s_->finalizing) {
      if (s_->finalize_hangs) return Status::in_progress();
      if (s_->finalize_polls_in_progress > 0) {
        --s_->finalize_polls_in_progress;
        return Status::in_progress();
      }
    }
    return Status::ok();
  }
  Status comm_finalize(Handle) override {
    ++s_->finalizes;
    s_->finalizing = true;
    if (s_->finalize_result.code == Status::kError) return s_->finalize_result;
    return Status::in_progress();
  }
  Status comm_destroy(Handle) override {
    ++s_->destroys;
    return Status::ok();
  }
  Status comm_abort(Handle) override {
    ++s_->aborts;
    return Status::ok();
  }
  Status all_reduce(const void*, void*, std::size_t, DataType, ReduceOp, Handle, Handle) override { return issue(); }
  Status broadcast(void*, std::size_t, DataType, int, Handle, Handle) override { return issue(); }
  Status all_gather(const void*, void*, std::size_t, DataType, Handle, Handle) override { return issue(); }
  Status reduce_scatter(const void*, void*, std::size_t, DataType, ReduceOp, Handle, Handle) override { return issue(); }

 private:
  Fate fate_of(int n) const {
    auto it = s_->fates.find(n);
    return it == s_->fates.end() ? Fate::kComplete : it->second;
  }
  Status issue() {
    int n = s_->collectives++;
    if (fate_of(n) == Fate::kEnqueueError) return Status::error("unhandled cuda error");
    if (!s_->launch_thread) return Status::ok();
    join_launch();
    launched_.store(false);
    launching_ = true;
    launcher_ = std::thread([this] { launched_.store(true, std::memory_order_release); });
    return Status::in_progress();
  }
  void join_launch() {
    if (launcher_.joinable()) launcher_.join();
    launching_ = false;
  }

  std::shared_ptr<State> s_;
  int group_stream_ = 0;
  int comm_ = 0;
  bool launching_ = false;
  std::atomic<bool> launched_{false};
  std::thread launcher_;
};

}  // namespace

std::unique_ptr<Api> make_api(std::shared_ptr<State> state) { return std::make_unique<FakeNccl>(std::move(state)); }

}  // namespace ddprun::runtime::nccl::fake
