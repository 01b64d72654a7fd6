// The nccl backend's core: issuing, breaking, teardown (see nccl_core.hpp; the watchdog and
// the works are in nccl_watchdog.cpp).

#include "nccl_core.hpp"

#include <cstdio>

#include "bounded_call.hpp"
#include "ddprun/common/error.hpp"
#include "process_groups.hpp"

namespace ddprun::runtime::nccl {

std::exception_ptr make_error(FailureKind kind, const std::string& message) {
  switch (kind) {
    case FailureKind::kTimeout: return std::make_exception_ptr(TimeoutError(message));
    case FailureKind::kCuda: return std::make_exception_ptr(CudaError(message));
    case FailureKind::kNetwork: break;
  }
  return std::make_exception_ptr(NetworkError(message));
}

DeviceGuard::DeviceGuard(Api& api, int device) : api_(api) {
  int current = -1;
  if (api.get_device(&current).is_ok() && current == device) return;
  auto s = api.set_device(device);
  if (!s.is_ok()) {
    throw CudaError("nccl: cudaSetDevice(" + std::to_string(device) + ") failed: " + s.message);
  }
  previous_ = current;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) api_.set_device(previous_);
}

Core::Core(CoreConfig c)
    : api_(std::move(c.api)), rank_(c.rank), size_(c.size), device_(c.device), timeout_(c.timeout), comm_(c.comm) {}

std::shared_ptr<Core> Core::create(CoreConfig config) {
  std::shared_ptr<Core> core(new Core(std::move(config)));
  auto s = core->api_->stream_create(&core->stream_);
  const char* call = "cudaStreamCreate";
  if (s.is_ok()) {
    s = core->api_->event_create(&core->ready_);
    call = "cudaEventCreate";
  }
  if (!s.is_ok()) {
    std::string msg = core->call_failure("creating the group's stream", CallResult::of(s, call));
    core->shutdown();  // aborts nothing healthy: no collective ran; destroys the communicator
    throw CudaError(msg);
  }
  core->watchdog_ = std::thread([c = core.get()] { c->watchdog(); });
  return core;
}

Core::~Core() { shutdown(); }

std::string Core::call_failure(const char* what, const CallResult& r) const {
  return "nccl: " + std::string(what) + " failed on device " + std::to_string(device_) + " (rank " +
         std::to_string(rank_) + " of " + std::to_string(size_) + "): " + r.call + ": " + r.status.message;
}

std::string Core::earlier_message(const char* what) const {
  return "nccl: " + std::string(what) + " on rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
         ": the process group failed earlier: " + cause_;
}

void Core::throw_earlier_locked(const char* what) const {
  if (!broken_) {
    throw UsageError("nccl: " + std::string(what) + " on rank " + std::to_string(rank_) +
                     ": the process group is being destroyed");
  }
  std::rethrow_exception(make_error(kind_, earlier_message(what)));
}

void Core::check_usable(const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ || closing_) throw_earlier_locked(what);
}

Handle Core::take_event() {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (!free_events_.empty()) {
      Handle e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
  }
  Handle e = nullptr;
  auto s = api_->event_create(&e);
  if (!s.is_ok()) throw CudaError(call_failure("creating an event", CallResult::of(s, "cudaEventCreate")));
  return e;
}

void Core::release_event(Handle event) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  if (closed_) {
    api_->event_destroy(event);
  } else {
    free_events_.push_back(event);
  }
}

Core::Ticket Core::begin_issue(const char* what, std::chrono::milliseconds timeout) {
  auto t = timeout.count() < 0 ? timeout_ : timeout;
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ || closing_) throw_earlier_locked(what);
  Ticket k{comm_, take_event(), Clock::now() + t, t};
  in_call_ = true;
  call_what_ = what;
  call_deadline_ = k.deadline;
  call_timeout_ = t;
  return k;
}

CallResult Core::order_after_compute() {
  Handle compute = compute_.load(std::memory_order_relaxed);
  auto s = api_->event_record(ready_, compute);
  if (!s.is_ok()) return CallResult::of(s, "cudaEventRecord");
  return CallResult::of(api_->stream_wait_event(stream_, ready_), "cudaStreamWaitEvent");
}

std::shared_ptr<NcclWork> Core::end_issue(const char* what, const Ticket& t, const CallResult& r) {
  std::unique_lock<std::mutex> lock(mu_);
  in_call_ = false;
  if (abort_waiting_) idle_cv_.notify_all();
  if (broken_) {  // the watchdog broke the group while this thread was inside NCCL
    release_event(t.done);
    throw_earlier_locked(what);
  }
  if (!r.status.is_ok()) {
    release_event(t.done);
    fail(lock, kind_of(r.status), call_failure(what, r) + "; the communicator was aborted");
  }
  auto w = std::make_shared<NcclWork>(shared_from_this(), t.done, what, t.deadline, t.timeout);
  // The watchdog is not woken: it looks every kWatchdogIdleTick when idle, and a wake-up per
  // collective (a context switch) would cost more than the rest of the enqueue.
  in_flight_.push_back(w);
  return w;
}

void Core::finish_stream_op(const char* what, const CallResult& r, bool wait_host) {
  // A copy or memset that could not be queued leaves the stream as it was: the group stays whole.
  if (!r.status.is_ok()) throw CudaError(call_failure(what, r));
  Handle done = take_event();
  struct Release {
    Core& c;
    Handle e;
    ~Release() { c.release_event(e); }
  } release{*this, done};
  CallResult after = CallResult::of(api_->event_record(done, stream_), "cudaEventRecord");
  if (after.status.is_ok()) {
    after = CallResult::of(api_->stream_wait_event(compute_.load(std::memory_order_relaxed), done), "cudaStreamWaitEvent");
  }
  if (after.status.is_ok() && wait_host) after = CallResult::of(api_->event_synchronize(done), "cudaEventSynchronize");
  std::unique_lock<std::mutex> lock(mu_);
  if (!after.status.is_ok()) fail(lock, FailureKind::kCuda, call_failure(what, after) + "; the communicator was aborted");
  // Behind a collective that failed, the copy ran after the abort: its data cannot be trusted.
  if (wait_host && broken_) throw_earlier_locked(what);
}

void Core::set_compute_stream(Handle stream) { compute_.store(stream, std::memory_order_relaxed); }

Handle Core::break_locked(FailureKind kind, const std::string& message, NcclWork* culprit) {
  if (!broken_) {
    broken_ = true;
    kind_ = kind;
    cause_ = message;
  }
  for (auto& w : in_flight_) {
    if (w->state_ != NcclWork::State::kPending) continue;
    if (w.get() != culprit && api_->event_query(w->done_).code == Status::kSuccess) {
      w->state_ = NcclWork::State::kCompleted;  // reached before the abort: its result stands
      continue;
    }
    w->state_ = NcclWork::State::kFailed;
    w->error_ = w.get() == culprit ? make_error(kind, message) : make_error(kind_, earlier_message(w->what_));
  }
  in_flight_.clear();
  idle_cv_.notify_all();
  Handle comm = comm_;
  comm_ = nullptr;
  return comm;
}

void Core::abort_comm(std::unique_lock<std::mutex>& lock, Handle comm, bool let_call_finish) {
  if (!comm) return;
  if (let_call_finish && in_call_) {
    abort_waiting_ = true;
    idle_cv_.wait_for(lock, kAbortGrace, [&] { return !in_call_; });
    abort_waiting_ = false;
  }
  lock.unlock();
  api_->comm_abort(comm);
  lock.lock();
}

void Core::fail(std::unique_lock<std::mutex>& lock, FailureKind kind, const std::string& message) {
  Handle comm = break_locked(kind, message, nullptr);
  abort_comm(lock, comm, false);
  std::rethrow_exception(make_error(kind, message));
}

void Core::shutdown() {
  std::unique_lock<std::mutex> lock(mu_);
  if (closing_) return;
  closing_ = true;
  watchdog_cv_.notify_all();
  // The watchdog settles every collective in flight, each by its deadline.
  idle_cv_.wait(lock, [&] { return in_flight_.empty(); });
  stopped_ = true;
  watchdog_cv_.notify_all();
  lock.unlock();
  if (watchdog_.joinable()) watchdog_.join();
  lock.lock();
  Handle comm = comm_;
  comm_ = nullptr;
  const bool healthy = !broken_;
  lock.unlock();
  if (comm && healthy) {
    auto api = api_;
    const int device = device_;
    auto r = run_bounded<Status>(
        [api, comm, device] {
          api->set_device(device);
          return api->comm_destroy(comm);
        },
        Clock::now() + timeout_, nullptr);
    if (!r) {
      std::fprintf(stderr, "ddprun: nccl: rank %d: ncclCommDestroy did not complete within %s; left to finish\n",
                   rank_, seconds_text(timeout_).c_str());
    } else if (!r->is_ok()) {
      std::fprintf(stderr, "ddprun: nccl: rank %d: ncclCommDestroy failed: %s\n", rank_, r->message.c_str());
    }
  } else if (comm) {
    api_->comm_abort(comm);
  }
  {
    std::lock_guard<std::mutex> pool(pool_mu_);
    closed_ = true;
    for (Handle e : free_events_) api_->event_destroy(e);
    free_events_.clear();
  }
  if (ready_) api_->event_destroy(ready_);
  if (stream_) api_->stream_destroy(stream_);
  ready_ = stream_ = nullptr;
}

}  // namespace ddprun::runtime::nccl
