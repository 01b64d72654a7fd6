#pragma once
// The signals the agent handles, read on its loop from a signalfd. They are blocked in the thread
// that makes the watch, and so in every thread it starts afterwards (the store's, the spawn
// pool's, the console's, NVML's): the kernel keeps them for the descriptor, whichever thread
// they were sent to. Children unblock them before their exec (spawn.cpp, stack_dump.cpp). A
// handler per signal (Boost.Asio's signal_set: 46 sigaction calls to install, as many to
// restore, and its own bookkeeping) cost 3% of a one-worker launch here.

#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <functional>
#include <vector>

namespace ddprun::agent {

class SignalWatch {
 public:
  // Blocks `signals` in this thread; from now on they wait for start(). Throws ddprun::Error if
  // no signalfd can be made.
  SignalWatch(boost::asio::io_context& io, const std::vector<int>& signals);
  // Reads (and drops) what arrived since the loop last looked, then gives the thread its mask
  // back: a signal still pending would take its default action then.
  ~SignalWatch();
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;

  // Calls `on_signal` on the loop for each signal (those that came before first), until stop().
  void start(std::function<void(int)> on_signal);
  void stop();

 private:
  void wait();
  std::vector<int> take();  // the signals queued now, in order

  sigset_t set_{};
  sigset_t old_{};
  boost::asio::posix::stream_descriptor fd_;
  std::function<void(int)> on_signal_;
};

}  // namespace ddprun::agent
