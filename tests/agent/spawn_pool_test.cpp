// SpawnPool: every index of a batch runs exactly once, on the caller's thread and the pool's,
// batch after batch; the pool's threads block every signal; spawn_threads picks 1 for a few
// workers, 2 or more from 8, and follows DDPRUN_SPAWN_THREADS.
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "workers/spawn_pool.hpp"

using ddprun::agent::SpawnPool;
using ddprun::agent::spawn_threads;

TEST_CASE("spawn pool: each index once, on several threads, batch after batch") {
  SpawnPool pool;
  pool.ensure(3);
  CHECK(pool.size() == 3);
  pool.ensure(2);  // never fewer
  CHECK(pool.size() == 3);
  for (std::size_t n : {0u, 1u, 7u, 64u, 1000u}) {
    std::vector<std::atomic<int>> runs(n);
    std::mutex mu;
    std::set<std::thread::id> threads;
    pool.run(n, [&](std::size_t i) {
      runs[i].fetch_add(1);
      std::lock_guard<std::mutex> lk(mu);
      threads.insert(std::this_thread::get_id());
    });
    for (std::size_t i = 0; i < n; ++i) CHECK(runs[i].load() == 1);
    CHECK(threads.size() <= 4);
  }
  // The pool's threads take part: a call that waits for 4 threads at once completes.
  std::atomic<int> arrived{0};
  pool.run(4, [&](std::size_t) {
    arrived.fetch_add(1);
    while (arrived.load() < 4) std::this_thread::yield();
  });
  CHECK(arrived.load() == 4);
}

TEST_CASE("spawn pool: its threads block every signal") {
  SpawnPool pool;
  pool.ensure(2);
  std::atomic<int> blocked_all{0}, others{0};
  const auto caller = std::this_thread::get_id();
  std::atomic<int> arrived{0};
  pool.run(3, [&](std::size_t) {
    arrived.fetch_add(1);
    while (arrived.load() < 3) std::this_thread::yield();  // one call on each thread
    if (std::this_thread::get_id() == caller) return;
    sigset_t mask;
    ::pthread_sigmask(SIG_SETMASK, nullptr, &mask);
    (sigismember(&mask, SIGCHLD) == 1 && sigismember(&mask, SIGTERM) == 1 ? blocked_all : others).fetch_add(1);
  });
  CHECK(blocked_all.load() == 2);
  CHECK(others.load() == 0);
}

TEST_CASE("spawn pool: how many threads start a group") {
  ::unsetenv("DDPRUN_SPAWN_THREADS");
  CHECK(spawn_threads(1) == 1);
  CHECK(spawn_threads(7) == 1);  // fewer than 8 workers: the loop's thread alone
  cpu_set_t cpus;
  REQUIRE(::sched_getaffinity(0, sizeof(cpus), &cpus) == 0);
  const unsigned want8 = CPU_COUNT(&cpus) >= 2 ? 2 : 1;
  CHECK(spawn_threads(8) == want8);
  CHECK(spawn_threads(1024) <= 8);
  ::setenv("DDPRUN_SPAWN_THREADS", "4", 1);
  CHECK(spawn_threads(2) == 4);
  for (const char* bad : {"0", "65", "4abc", "abc", "", " 4"}) {  // out of range or not a number: ignored
    INFO("DDPRUN_SPAWN_THREADS='" << bad << "'");
    ::setenv("DDPRUN_SPAWN_THREADS", bad, 1);
    CHECK(spawn_threads(8) == want8);
    CHECK(spawn_threads(2) == 1);
  }
  ::unsetenv("DDPRUN_SPAWN_THREADS");
}
