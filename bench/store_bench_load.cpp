#include "store_bench_load.hpp"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fmt/core.h>
#include <stdexcept>
#include <string>
#include <vector>

#include "store_bench_client.hpp"

namespace store_bench {
namespace {

struct Conn {
  int fd = -1;
  int step = 0;   // throughput: 0 = SET+GET in flight, 1 = ADD in flight
  int phase = 0;  // barrier: 0 connecting, 1 ADD sent, 2 WAIT sent, 3 released
  std::string in;
  Clock::time_point sent;
};

Percentiles percentiles(std::vector<std::uint32_t>& us) {
  if (us.empty()) return {};
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2] / 1.0, us[std::min(us.size() - 1, us.size() * 99 / 100)] / 1.0};
}

void watch(int ep, int op, int fd, std::uint32_t events, std::uint32_t index) {
  epoll_event e{};
  e.events = events;
  e.data.u32 = index;
  epoll_ctl(ep, op, fd, &e);
}

class ThroughputRun {
 public:
  ThroughputRun(const Server& server, int nconns, double duration, int run)
      : server_(server), duration_(duration), conns_(nconns), setget_(nconns) {
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    for (int i = 0; i < nconns; ++i) {
      conns_[i].fd = connect_blocking(server.port);
      watch(ep_, EPOLL_CTL_ADD, conns_[i].fd, EPOLLIN, static_cast<std::uint32_t>(i));
      auto key = fmt::format("/bench{}/key{}", run, i);
      setget_[i] = frame_set(key, std::string(64, 'v')) + frame_get(key);
    }
    add_ = frame_add(fmt::format("/bench{}/counter", run), 1);
    lat_setget_.reserve(1 << 20);
    lat_add_.reserve(1 << 20);
  }
  ~ThroughputRun() {
    for (auto& c : conns_) close(c.fd);
    close(ep_);
  }

  ThroughputResult measure() {
    warm_end_ = Clock::now() + std::chrono::milliseconds(300);
    end_ = warm_end_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(duration_));
    double cpu0 = server_.cpu_seconds();
    for (std::size_t i = 0; i < conns_.size(); ++i) issue(i);
    in_flight_ = conns_.size();
    std::vector<epoll_event> events(1024);
    while (in_flight_ > 0) {
      int n = epoll_wait(ep_, events.data(), static_cast<int>(events.size()), 5000);
      if (n <= 0) throw std::runtime_error("throughput: no reply for 5 s");
      auto now = Clock::now();
      for (int k = 0; k < n; ++k) on_readable(events[k].data.u32, now);
    }
    double cpu = server_.cpu_seconds() - cpu0;
    ThroughputResult r;
    r.ops_per_s = static_cast<double>(ops_) / duration_;
    r.server_us_per_op = all_ops_ ? cpu * 1e6 / static_cast<double>(all_ops_) : 0;
    r.setget = percentiles(lat_setget_);
    r.add = percentiles(lat_add_);
    return r;
  }

 private:
  void issue(std::size_t i) {
    auto& c = conns_[i];
    c.sent = Clock::now();
    send_all(c.fd, c.step == 0 ? setget_[i] : add_);
  }

  // A connection has bytes: when its reply is complete, count it and send the next request.
  void on_readable(std::size_t i, Clock::time_point now) {
    auto& c = conns_[i];
    char buf[65536];
    ssize_t got = recv(c.fd, buf, sizeof(buf), 0);
    if (got <= 0) throw std::runtime_error("throughput: server closed a connection");
    c.in.append(buf, static_cast<std::size_t>(got));
    std::size_t size = reply_size(c.in, c.step == 0);
    if (size == 0) return;
    c.in.erase(0, size);
    int ops = c.step == 0 ? 2 : 1;
    if (c.sent >= warm_end_ && now <= end_) {
      auto us = std::chrono::duration_cast<std::chrono::microseconds>(now - c.sent).count();
      (c.step == 0 ? lat_setget_ : lat_add_).push_back(static_cast<std::uint32_t>(us));
      ops_ += ops;
    }
    all_ops_ += ops;
    c.step ^= 1;
    if (now < end_) {
      issue(i);
    } else {
      --in_flight_;
    }
  }

  const Server& server_;
  double duration_;
  int ep_ = -1;
  std::vector<Conn> conns_;
  std::vector<std::string> setget_;
  std::string add_;
  std::vector<std::uint32_t> lat_setget_, lat_add_;
  Clock::time_point warm_end_, end_;
  std::uint64_t ops_ = 0, all_ops_ = 0;
  std::size_t in_flight_ = 0;
};

class BarrierRun {
 public:
  BarrierRun(std::uint16_t port, int n, int run, double limit_s) : port_(port), n_(n), limit_s_(limit_s), conns_(n) {
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    add_ = frame_add(fmt::format("/barrier{}/count", run), 1);
    wait_ = frame_wait(fmt::format("/barrier{}/go", run));
    release_ = frame_set(fmt::format("/barrier{}/go", run), "1") + wait_;
  }
  ~BarrierRun() {
    for (auto& c : conns_) close(c.fd);
    close(ep_);
  }

  BarrierResult measure() {
    t0_ = Clock::now();
    open_more();
    std::vector<epoll_event> events(4096);
    while (released_ < n_) {
      int k = epoll_wait(ep_, events.data(), static_cast<int>(events.size()), 30000);
      if (k <= 0) throw std::runtime_error(fmt::format("nothing for 30 s with {}/{} released", released_, n_));
      if (seconds_since(t0_) > limit_s_) {
        throw std::runtime_error(fmt::format("over {:.0f} s, {}/{} connected, {}/{} released", limit_s_, connected_,
                                             n_, released_, n_));
      }
      for (int j = 0; j < k; ++j) on_event(events[j].data.u32, events[j].events);
    }
    return BarrierResult{connect_s_, seconds_since(t0_), {}};
  }

 private:
  // Connects in flight at once: more would overflow the listen backlog (net.core.somaxconn)
  // and cost SYN retransmits of a second, for either server alike.
  static constexpr int kConnectWindow = 256;

  void open_more() {
    while (next_ < n_ && connecting_ < kConnectWindow) {
      auto& c = conns_[next_];
      c.fd = make_socket();
      start_connect(c.fd, port_, next_);
      watch(ep_, EPOLL_CTL_ADD, c.fd, EPOLLOUT | EPOLLIN, static_cast<std::uint32_t>(next_));
      ++next_;
      ++connecting_;
    }
  }

  void on_event(std::uint32_t idx, std::uint32_t events) {
    auto& c = conns_[idx];
    if (c.phase == 0 && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return on_connected(idx);
    if (!(events & EPOLLIN)) return;
    char buf[4096];
    ssize_t got = recv(c.fd, buf, sizeof(buf), 0);
    if (got <= 0) throw std::runtime_error("the server closed a connection");
    c.in.append(buf, static_cast<std::size_t>(got));
    if (c.phase == 1 && c.in.size() >= 8) {
      std::int64_t v;
      std::memcpy(&v, c.in.data(), 8);
      c.in.erase(0, 8);
      send_all(c.fd, v == n_ ? release_ : wait_);
      c.phase = 2;
    }
    if (c.phase == 2 && !c.in.empty()) {
      c.phase = 3;
      ++released_;
    }
  }

  void on_connected(std::uint32_t idx) {
    auto& c = conns_[idx];
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) throw std::runtime_error(std::string("barrier connect: ") + strerror(err));
    watch(ep_, EPOLL_CTL_MOD, c.fd, EPOLLIN, idx);
    --connecting_;
    if (++connected_ == n_) connect_s_ = seconds_since(t0_);
    send_all(c.fd, add_);
    c.phase = 1;
    open_more();
  }

  std::uint16_t port_;
  int n_;
  double limit_s_;
  int ep_ = -1;
  std::vector<Conn> conns_;
  std::string add_, wait_, release_;
  Clock::time_point t0_;
  int next_ = 0, connecting_ = 0, connected_ = 0, released_ = 0;
  double connect_s_ = 0;
};

}  // namespace

ThroughputResult throughput(const Server& server, int nconns, double duration, int run) {
  return ThroughputRun(server, nconns, duration, run).measure();
}

BarrierResult barrier(std::uint16_t port, int n, int run, double limit_s) {
  try {
    return BarrierRun(port, n, run, limit_s).measure();
  } catch (const std::runtime_error& e) {
    BarrierResult r;
    r.error = e.what();
    return r;
  }
}

}  // namespace store_bench
