#pragma once
// The nccl backend's core (private): one blocking NCCL communicator on one device, the group's
// stream, the collectives in flight, and the watchdog thread that ends them (PyTorch's
// ProcessGroupNCCL design).
//
// The issuing thread only enqueues: a collective costs it a few CUDA/NCCL calls and never
// waits for the device, sleeps or wakes another thread. The watchdog looks every kWatchdogTick
// while collectives are in flight (every kWatchdogIdleTick otherwise): it retires those whose
// event was reached (touching the heartbeat file), and when NCCL reports an asynchronous error,
// a collective passes its deadline or a call stays inside NCCL past it, it breaks the group and
// aborts the communicator, which makes NCCL's kernels (and a call blocked on a dead peer) end,
// so nothing waits for ever. A time-out is seen at most a tick (an idle tick for a collective
// issued while nothing was in flight) after its deadline.
//
// Failure rules: the first failure breaks the group; every collective still in flight is then
// settled, before the abort: completed if its event was already reached, failed otherwise
// (after the abort its event is reached too, without its result); every later call fails at
// once naming the first cause; every wait() of a failed work rethrows its error.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/runtime/process_group.hpp"
#include "nccl_api.hpp"

namespace ddprun::runtime::nccl {

using Clock = std::chrono::steady_clock;

// How often the watchdog looks at the collectives in flight (and, while there are none, at a
// call that may be blocked in NCCL: kWatchdogIdleTick).
inline constexpr std::chrono::milliseconds kWatchdogTick{10};
inline constexpr std::chrono::milliseconds kWatchdogIdleTick{100};
// How long the watchdog lets a call that is inside NCCL finish before aborting the communicator
// under it (a healthy call takes microseconds; one blocked on a dead peer is what the abort ends).
inline constexpr std::chrono::milliseconds kAbortGrace{1000};

// The type every error of a broken group has: that of its first failure.
enum class FailureKind { kTimeout, kNetwork, kCuda };
std::exception_ptr make_error(FailureKind kind, const std::string& message);
inline FailureKind kind_of(const Status& s) {
  return s.code == Status::kCudaError ? FailureKind::kCuda : FailureKind::kNetwork;
}

// The outcome of a sequence of calls: the first that failed, or success.
struct CallResult {
  Status status;
  const char* call = nullptr;
  static CallResult of(Status s, const char* call) { return {std::move(s), call}; }
};

// The calling thread on `device` for its scope; the thread's own device back afterwards.
class DeviceGuard {
 public:
  DeviceGuard(Api& api, int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  Api& api_;
  int previous_ = -1;  // -1: nothing to put back
};

class Core;

// A collective in flight. wait(): the compute stream waits for it; synchronize(): the host does.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Core> core, Handle done, const char* what, Clock::time_point deadline,
           std::chrono::milliseconds timeout)
      : core_(std::move(core)), done_(done), what_(what), deadline_(deadline), timeout_(timeout) {}
  ~NcclWork() override;
  void wait() override;
  void synchronize() override;

 private:
  friend class Core;
  enum class State { kPending, kCompleted, kFailed };

  // Constant.
  std::shared_ptr<Core> core_;
  Handle done_;  // recorded after the collective on the group's stream; owned, back to the pool
  const char* what_;
  Clock::time_point deadline_;
  std::chrono::milliseconds timeout_;
  // Guarded by the core's mu_.
  State state_ = State::kPending;
  std::exception_ptr error_;
};

struct CoreConfig {
  std::shared_ptr<Api> api;
  int rank = 0, size = 1, device = 0;
  std::chrono::milliseconds timeout{300000};  // default time-out of every collective
  Handle comm = nullptr;                      // initialised; the core owns it from now on
};

class Core : public std::enable_shared_from_this<Core> {
 public:
  // Creates the stream and the ordering event on the calling thread's device (which must be
  // config.device) and starts the watchdog. Throws CudaError (and aborts the communicator).
  static std::shared_ptr<Core> create(CoreConfig config);
  ~Core();
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // Enqueues a collective on the group's stream after the compute stream's work so far:
  // issue(comm, stream) makes the NCCL calls. The watchdog watches the returned work until it
  // completes. Throws at once when the group is broken, and when a call fails (which breaks it).
  template <typename Issue>
  std::shared_ptr<NcclWork> enqueue(const char* what, std::chrono::milliseconds timeout, Issue&& issue) {
    std::lock_guard<std::mutex> serial(issue_mu_);
    Ticket t = begin_issue(what, timeout);
    CallResult r = order_after_compute();
    if (r.status.is_ok()) r = issue(t.comm, stream_);
    if (r.status.is_ok()) r = CallResult::of(api_->event_record(t.done, stream_), "cudaEventRecord");
    return end_issue(what, t, r);
  }
  // A copy or memset on the group's stream between the compute stream's earlier and later
  // work. With `wait_host`, returns once it is done. Throws as enqueue does.
  template <typename Op>
  void stream_op(const char* what, bool wait_host, Op&& op) {
    std::lock_guard<std::mutex> serial(issue_mu_);
    check_usable(what);
    CallResult r = order_after_compute();
    if (r.status.is_ok()) r = op(stream_);
    finish_stream_op(what, r, wait_host);
  }
  // ncclCommSplit of this group's communicator (a collective of the group), bounded by
  // `timeout`. Returns nullptr for color < 0. Throws, breaking the group, when it fails.
  Handle split(int color, int key, std::chrono::milliseconds timeout);

  void set_compute_stream(Handle stream);
  // Waits for the collectives in flight (each within its time-out), stops the watchdog,
  // destroys the communicator (aborts it if the group failed) and frees the stream and events.
  // Idempotent; never throws.
  void shutdown();

  Api& api() { return *api_; }
  const std::shared_ptr<Api>& api_shared() const { return api_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // "nccl: <what> failed on device D (rank R of N): <call>: <message>".
  std::string call_failure(const char* what, const CallResult& r) const;

 private:
  friend class NcclWork;
  struct Ticket {
    Handle comm, done;
    Clock::time_point deadline;
    std::chrono::milliseconds timeout;
  };

  explicit Core(CoreConfig config);
  Ticket begin_issue(const char* what, std::chrono::milliseconds timeout);
  void check_usable(const char* what);
  CallResult order_after_compute();
  std::shared_ptr<NcclWork> end_issue(const char* what, const Ticket& t, const CallResult& r);
  void finish_stream_op(const char* what, const CallResult& r, bool wait_host);
  Handle take_event();
  void release_event(Handle event);

  // Breaks the group (under mu_): the first failure is kept as the cause; works in flight are
  // settled. Returns the communicator, which the caller aborts after unlocking.
  Handle break_locked(FailureKind kind, const std::string& message, NcclWork* culprit);
  [[noreturn]] void throw_earlier_locked(const char* what) const;
  // Breaks the group, aborts the communicator and throws `message` as `kind`.
  [[noreturn]] void fail(std::unique_lock<std::mutex>& lock, FailureKind kind, const std::string& message);
  void abort_comm(std::unique_lock<std::mutex>& lock, Handle comm, bool wait_for_call);

  // One look by the watchdog (under mu_): the communicator to abort, if it broke the group, and
  // whether a call inside NCCL may be let finish first.
  struct Verdict {
    Handle abort = nullptr;
    bool let_call_finish = true;
  };
  void watchdog();
  Verdict check_locked();
  Clock::time_point next_wake_locked() const;
  std::string earlier_message(const char* what) const;

  // ---- constant after construction
  std::shared_ptr<Api> api_;
  const int rank_, size_, device_;
  const std::chrono::milliseconds timeout_;
  Handle stream_ = nullptr;
  Handle ready_ = nullptr;  // "the compute stream got here"; used under issue_mu_ only
  // The trainer's stream (nullptr: the legacy NULL stream); set by the thread using the group.
  std::atomic<Handle> compute_{nullptr};

  // ---- serialises issuing threads; held across the NCCL calls of one operation
  std::mutex issue_mu_;

  // ---- guarded by mu_ (the watchdog, issuing threads and works)
  mutable std::mutex mu_;
  std::condition_variable watchdog_cv_;  // wakes the watchdog: work in flight, or stop
  std::condition_variable idle_cv_;      // nothing in flight any more; a call left NCCL
  Handle comm_ = nullptr;                // nullptr once aborted or destroyed
  std::deque<std::shared_ptr<NcclWork>> in_flight_;
  bool in_call_ = false;                 // an issuing thread is inside NCCL with comm_
  const char* call_what_ = "";           // ... for this operation, until this deadline
  Clock::time_point call_deadline_{};
  std::chrono::milliseconds call_timeout_{};
  bool abort_waiting_ = false;           // the watchdog waits for in_call_ to clear
  bool broken_ = false;
  FailureKind kind_ = FailureKind::kNetwork;
  std::string cause_;                    // the first failure's message
  bool closing_ = false, stopped_ = false;

  // ---- guarded by pool_mu_ (taken after mu_ when both are held: a work dropped from in_flight_
  // under mu_ gives its event back)
  std::mutex pool_mu_;
  std::vector<Handle> free_events_;
  bool closed_ = false;  // the stream is gone: events are destroyed, not pooled

  std::thread watchdog_;  // last: started once everything above exists
};

}  // namespace ddprun::runtime::nccl
