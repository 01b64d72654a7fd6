// The nccl backend's watchdog and works (see nccl_core.hpp), and ncclCommSplit.

#include <cstdio>

#include "bounded_call.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/runtime/heartbeat.hpp"
#include "nccl_core.hpp"
#include "process_groups.hpp"

namespace ddprun::runtime::nccl {

void Core::watchdog() {
  // Every thread that makes CUDA calls for the group sets its device first.
  auto s = api_->set_device(device_);
  if (!s.is_ok()) {
    std::fprintf(stderr, "ddprun: nccl: rank %d: the watchdog could not set device %d: %s\n", rank_, device_,
                 s.message.c_str());
  }
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopped_) {
    Verdict v = check_locked();
    if (v.abort) {
      abort_comm(lock, v.abort, v.let_call_finish);
      continue;
    }
    if (in_flight_.empty()) idle_cv_.notify_all();
    watchdog_cv_.wait_until(lock, next_wake_locked());
  }
}

Clock::time_point Core::next_wake_locked() const {
  auto now = Clock::now();
  if (in_flight_.empty()) return now + kWatchdogIdleTick;
  auto wake = now + kWatchdogTick;
  for (const auto& w : in_flight_) wake = std::min(wake, w->deadline_ + std::chrono::milliseconds(1));
  return wake;
}

Core::Verdict Core::check_locked() {
  if (broken_ || !comm_) return {};
  bool retired = false;
  while (!in_flight_.empty()) {
    auto& w = *in_flight_.front();
    if (w.state_ == NcclWork::State::kPending) {
      auto q = api_->event_query(w.done_);
      if (q.failed()) {
        return {break_locked(FailureKind::kCuda,
                             call_failure(w.what_, CallResult::of(q, "cudaEventQuery")) + "; the communicator was aborted",
                             &w)};
      }
      if (q.code != Status::kSuccess) break;
      w.state_ = NcclWork::State::kCompleted;
    }
    in_flight_.pop_front();
    retired = true;
  }
  if (retired) heartbeat();
  const auto now = Clock::now();
  const std::string on = " on rank " + std::to_string(rank_) + " of " + std::to_string(size_);
  if (in_call_ && now > call_deadline_) {
    return {break_locked(FailureKind::kTimeout,
                         "nccl: " + std::string(call_what_) + on + " timed out after " + seconds_text(call_timeout_) +
                             " inside NCCL (a peer may have died or stalled); the communicator was aborted",
                         nullptr),
            false};
  }
  if (in_flight_.empty()) return {};
  auto s = api_->async_error(comm_);
  if (s.failed()) {
    auto& w = *in_flight_.front();
    return {break_locked(kind_of(s), "nccl: " + std::string(w.what_) + on + ": " + s.message +
                                               " (a peer may have died); the communicator was aborted",
                         &w)};
  }
  for (auto& w : in_flight_) {
    if (now <= w->deadline_) continue;
    return {break_locked(FailureKind::kTimeout,
                         "nccl: " + std::string(w->what_) + on + " timed out after " + seconds_text(w->timeout_) +
                             " (a peer may have died or stalled); the communicator was aborted",
                         w.get())};
  }
  return {};
}

NcclWork::~NcclWork() { core_->release_event(done_); }

void NcclWork::wait() {
  DeviceGuard guard(core_->api(), core_->device());
  std::unique_lock<std::mutex> lock(core_->mu_);
  if (state_ == State::kFailed) std::rethrow_exception(error_);
  if (state_ == State::kCompleted) return;
  // The trainer's later work runs after the collective; the host goes on at once.
  auto s = core_->api_->stream_wait_event(core_->compute_.load(std::memory_order_relaxed), done_);
  if (!s.is_ok()) {
    core_->fail(lock, FailureKind::kCuda,
                core_->call_failure(what_, CallResult::of(s, "cudaStreamWaitEvent")) + "; the communicator was aborted");
  }
}

void NcclWork::synchronize() {
  DeviceGuard guard(core_->api(), core_->device());
  {
    std::lock_guard<std::mutex> lock(core_->mu_);
    if (state_ == State::kFailed) std::rethrow_exception(error_);
    if (state_ == State::kCompleted) return;
  }
  // Bounded by the watchdog: past the deadline it aborts the communicator, NCCL's kernels exit
  // and the event is reached.
  auto s = core_->api_->event_synchronize(done_);
  std::unique_lock<std::mutex> lock(core_->mu_);
  if (state_ == State::kFailed) std::rethrow_exception(error_);
  if (!s.is_ok()) {
    core_->fail(lock, FailureKind::kCuda,
                core_->call_failure(what_, CallResult::of(s, "cudaEventSynchronize")) + "; the communicator was aborted");
  }
  // Still pending, so the group was whole when the event was reached (break_locked settles
  // every pending work before it aborts): the collective completed.
  state_ = State::kCompleted;
}

Handle Core::split(int color, int key, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> serial(issue_mu_);
  check_usable("split");
  Handle parent;
  {
    std::lock_guard<std::mutex> lock(mu_);
    parent = comm_;
  }
  auto api = api_;
  const int device = device_;
  using Result = std::pair<Status, Handle>;
  auto r = run_bounded<Result>(
      [api, device, parent, color, key] {
        Handle child = nullptr;
        auto s = api->set_device(device);
        if (s.is_ok()) s = api->comm_split(parent, color, key, &child);
        return Result{s, child};
      },
      Clock::now() + timeout,
      [api](Result& late) {
        if (late.second) api->comm_abort(late.second);  // nobody will use it
      });
  std::unique_lock<std::mutex> lock(mu_);
  if (!r) {
    fail(lock, FailureKind::kTimeout,
         "nccl: split on rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " timed out after " +
             seconds_text(timeout) + " (did every rank of the group call split?); the communicator was aborted");
  }
  if (!r->first.is_ok()) {
    fail(lock, kind_of(r->first),
         call_failure("split", CallResult::of(r->first, "ncclCommSplit")) + "; the communicator was aborted");
  }
  return r->second;
}

}  // namespace ddprun::runtime::nccl
