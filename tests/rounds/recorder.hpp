#pragma once
// What a rendezvous tells its listener and its fence, collected from whatever thread; the test
// waits for it and asserts on its own thread (Catch's macros are not thread-safe).

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "ddprun/rounds/rendezvous.hpp"

namespace ddprun::rounds::testing {

using namespace std::chrono_literals;

struct Recorder : Rendezvous::Listener, Fence {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<RoundInfo> ready;
  std::deque<RoundOutcome> over;
  std::deque<RendezvousFailure> failed;
  int finished = 0;
  int waiting = 0;  // on_waiting_for_place calls
  std::deque<std::chrono::steady_clock::time_point> renewals;  // deadlines the fence was given
  int releases = 0;

  template <typename F>
  void note(F f) {
    {
      std::lock_guard<std::mutex> lk(mu);
      f();
    }
    cv.notify_all();
  }
  void on_round_ready(const RoundInfo& i) override { note([&] { ready.push_back(i); }); }
  void on_rendezvous_failed(const RendezvousFailure& f) override { note([&] { failed.push_back(f); }); }
  void on_round_over(const RoundOutcome& o) override { note([&] { over.push_back(o); }); }
  void on_finished() override { note([&] { ++finished; }); }
  void on_waiting_for_place() override { note([&] { ++waiting; }); }
  void renewed_until(std::chrono::steady_clock::time_point d) override { note([&] { renewals.push_back(d); }); }
  void release() override { note([&] { ++releases; }); }

  template <typename Pred>
  bool wait(Pred p, std::chrono::milliseconds limit = 10s) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, limit, p);
  }
  bool wait_ready(std::size_t n = 1) { return wait([&] { return ready.size() >= n; }); }
  bool wait_over(std::size_t n = 1) { return wait([&] { return over.size() >= n; }); }
  bool wait_failed() { return wait([&] { return !failed.empty(); }); }
};

// Runs posted functions on the calling thread: the recorder is thread-safe.
inline Post inline_post() {
  return [](std::function<void()> f) { f(); };
}

}  // namespace ddprun::rounds::testing
