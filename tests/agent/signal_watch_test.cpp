// SignalWatch: signals read from a signalfd on the loop. Those sent before start() come at
// start(), in order; a thread started after the watch inherits the block, so a signal sent to the
// process reaches the watch whichever thread the kernel picks; after stop(), what arrives is
// dropped when the watch goes (not its default action, which for SIGUSR1 would end this test
// program), and the thread's mask is as before.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>
#include <vector>

#include "signal_watch.hpp"

using ddprun::agent::SignalWatch;

namespace {

bool blocked(int sig) {
  sigset_t now;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &now);
  return sigismember(&now, sig) == 1;
}

// Runs the loop until `done` or 5 s.
void run_until(boost::asio::io_context& io, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    io.run_one_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

TEST_CASE("signal watch: signals sent before start() come at start(), each once") {
  REQUIRE_FALSE(blocked(SIGUSR1));
  boost::asio::io_context io;
  std::vector<int> got;
  {
    SignalWatch w(io, {SIGUSR1, SIGUSR2});
    CHECK(blocked(SIGUSR1));
    CHECK(blocked(SIGUSR2));
    ::raise(SIGUSR1);
    ::raise(SIGUSR2);
    w.start([&](int sig) { got.push_back(sig); });
    run_until(io, [&] { return got.size() >= 2; });
    w.stop();
  }
  CHECK(got == std::vector<int>{SIGUSR1, SIGUSR2});
  CHECK_FALSE(blocked(SIGUSR1));
  CHECK_FALSE(blocked(SIGUSR2));
}

TEST_CASE("signal watch: a thread started after it inherits the block - process signals reach the watch") {
  boost::asio::io_context io;
  std::atomic<int> got{0};
  SignalWatch w(io, {SIGUSR1});
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    CHECK(blocked(SIGUSR1));
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  w.start([&](int) { ++got; });
  for (int i = 0; i < 20; ++i) {
    ::kill(::getpid(), SIGUSR1);  // to the process: any thread that does not block it may take it
    run_until(io, [&] { return got.load() > i; });
  }
  stop = true;
  busy.join();
  w.stop();
  CHECK(got.load() == 20);
}

TEST_CASE("signal watch: after stop(), a signal is dropped with the watch, not acted upon") {
  boost::asio::io_context io;
  int got = 0;
  {
    SignalWatch w(io, {SIGUSR1});
    w.start([&](int) { ++got; });
    w.stop();
    ::raise(SIGUSR1);  // pending: SIGUSR1's default action would end this program at the unblock
  }
  io.restart();
  io.poll();
  CHECK(got == 0);
  CHECK_FALSE(blocked(SIGUSR1));
}
