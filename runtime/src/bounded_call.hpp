#pragma once
// A blocking call bounded by a deadline (private). NCCL's blocking calls that wait for every
// peer (communicator init and split, destroy) cannot be interrupted safely while they run:
// aborting a communicator whose init or destroy is under way on another thread frees it under
// that thread. So the call runs on a thread of its own and the caller waits for it until the
// deadline; a call that overstays is left to finish on its own (`late` then runs on its thread,
// with its result, to release what it made). PyTorch's ProcessGroupNCCL::shutdown does the same
// with std::async.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

namespace ddprun::runtime {

template <typename R>
std::optional<R> run_bounded(std::function<R()> call, std::chrono::steady_clock::time_point deadline,
                             std::function<void(R&)> late) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<R> result;
    bool abandoned = false;
  };
  auto shared = std::make_shared<Shared>();
  std::thread worker([shared, call = std::move(call), late = std::move(late)] {
    R r = call();
    std::unique_lock<std::mutex> lock(shared->mu);
    if (shared->abandoned) {
      lock.unlock();
      if (late) late(r);
      return;
    }
    shared->result = std::move(r);
    shared->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(shared->mu);
  if (shared->cv.wait_until(lock, deadline, [&] { return shared->result.has_value(); })) {
    lock.unlock();
    worker.join();
    return std::move(shared->result);
  }
  shared->abandoned = true;
  worker.detach();
  return std::nullopt;
}

}  // namespace ddprun::runtime
