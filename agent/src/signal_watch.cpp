#include "signal_watch.hpp"

#include <pthread.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ddprun/common/error.hpp"

namespace ddprun::agent {

SignalWatch::SignalWatch(boost::asio::io_context& io, const std::vector<int>& signals) : fd_(io) {
  sigemptyset(&set_);
  for (int s : signals) sigaddset(&set_, s);
  ::pthread_sigmask(SIG_BLOCK, &set_, &old_);
  int fd = ::signalfd(-1, &set_, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    throw Error(std::string("cannot watch signals (signalfd): ") + std::strerror(e));
  }
  fd_.assign(fd);
}

void SignalWatch::start(std::function<void(int)> on_signal) {
  on_signal_ = std::move(on_signal);
  wait();
}

void SignalWatch::stop() {
  on_signal_ = nullptr;
  boost::system::error_code ignored;
  fd_.cancel(ignored);
}

SignalWatch::~SignalWatch() {
  take();
  boost::system::error_code ignored;
  fd_.close(ignored);
  ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

std::vector<int> SignalWatch::take() {
  std::vector<int> out;
  signalfd_siginfo info[16];
  for (;;) {
    ssize_t n = ::read(fd_.native_handle(), info, sizeof(info));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n / static_cast<ssize_t>(sizeof(signalfd_siginfo)); ++i) {
      out.push_back(static_cast<int>(info[i].ssi_signo));
    }
  }
  return out;
}

void SignalWatch::wait() {
  fd_.async_wait(boost::asio::posix::stream_descriptor::wait_read, [this](boost::system::error_code ec) {
    if (ec || !on_signal_) return;
    for (int sig : take()) {
      if (on_signal_) on_signal_(sig);
    }
    if (on_signal_) wait();
  });
}

}  // namespace ddprun::agent
