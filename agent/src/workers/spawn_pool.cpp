#include "workers/spawn_pool.hpp"

#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <spdlog/spdlog.h>

#include "ddprun/common/text.hpp"

namespace ddprun::agent {

SpawnPool::~SpawnPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    quit_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void SpawnPool::ensure(unsigned threads) {
  if (threads <= threads_.size()) return;
  // The new threads inherit this mask: every signal blocked.
  sigset_t all, saved;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &saved);
  unsigned seen;
  {
    std::lock_guard<std::mutex> lk(mu_);
    seen = generation_;
  }
  try {
    while (threads_.size() < threads) threads_.emplace_back([this, seen] { serve(seen); });
  } catch (...) {  // fewer threads than asked: the batch runs on those there are
  }
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
}

void SpawnPool::serve(unsigned seen) {
  unsigned gen = seen;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      start_cv_.wait(lk, [&] { return quit_ || generation_ != gen; });
      if (quit_) return;
      gen = generation_;
    }
    take_work();
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++finished_;
    }
    done_cv_.notify_one();
  }
}

void SpawnPool::take_work() {
  for (;;) {
    std::size_t i;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (next_ >= total_) return;
      i = next_++;
    }
    (*job_)(i);
  }
}

void SpawnPool::run(std::size_t n, const std::function<void(std::size_t)>& fn) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    total_ = n;
    next_ = 0;
    finished_ = 0;
    ++generation_;
  }
  start_cv_.notify_all();
  take_work();
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return finished_ == threads_.size(); });
  job_ = nullptr;
}

unsigned spawn_threads(std::size_t n) {
  if (const char* set = std::getenv("DDPRUN_SPAWN_THREADS")) {
    if (auto k = parse_int(set, 1, 64)) return static_cast<unsigned>(*k);
    static std::once_flag said;  // (asked at every group's start)
    std::call_once(said, [&] {
      spdlog::warn("ddprun: DDPRUN_SPAWN_THREADS='{}' is not a number of threads from 1 to 64: ignored", set);
    });
  }
  cpu_set_t cpus;
  std::size_t ncpu = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  if (ncpu < 2 || n < 8) return 1;
  return static_cast<unsigned>(std::clamp<std::size_t>(std::min(ncpu / 4, n / 4), 2, 8));
}

}  // namespace ddprun::agent
