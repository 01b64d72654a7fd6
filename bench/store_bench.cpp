// Store benchmark: the same C++ load generator against ddprun-store and against PyTorch 1.13's
// own TCPStore server, in one run, printing the ratio.
//
//   throughput: N connections (closed loop, one request in flight each) cycling through
//               SET k, GET k (sent together: SET has no reply) and ADD counter;
//               ops/s counts requests (3 per cycle); latency per reply: SET+GET and ADD.
//   barrier:    N clients connect, each ADDs a counter, the one that reaches N SETs a key,
//               all WAIT for it; time from the first connect to the last release.
//
// Requests use the 1.13 numbering, the one both servers understand.
//   under abuse: the throughput point of 64 connections again while one more client misbehaves
//               (a slow reader; an amplifier), next to the same point undisturbed.
//
// ddprun-store runs as shipped: access control on (same_user: every connection's owner is
// looked up); a barrier row without it shows that cost.
// Usage: store_bench [--duration S] [--conns 1,64,1024] [--barrier 1000,10000] [--rounds R]
//                    [--abuse_conns N]

#include <fcntl.h>
#include <sched.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fmt/core.h>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddprun/rendezvous/protocol.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace wire = ddprun::rendezvous::wire;
using wire::Dialect;
using wire::Op;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// On a machine with >= 2 CPUs the generator runs on CPU 0 and the server under test on CPU 1,
// for both servers alike: without it the scheduler sometimes stacks them on one core, and runs
// vary by 30 %.
void pin_to_cpu(int cpu) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

// ---- servers under test, as child processes --------------------------------------------------

struct Server {
  std::string name;
  pid_t pid = -1;
  int stdin_fd = -1;
  std::uint16_t port = 0;

  static Server spawn(std::string name, std::vector<std::string> argv) {
    int out[2], in[2];
    if (pipe(out) != 0 || pipe(in) != 0) throw std::runtime_error("pipe failed");
    pid_t pid = fork();
    if (pid == 0) {
      pin_to_cpu(1);
      dup2(out[1], 1);
      dup2(in[0], 0);
      close(out[0]);
      close(in[1]);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
    close(out[1]);
    close(in[0]);
    Server s;
    s.name = std::move(name);
    s.pid = pid;
    s.stdin_fd = in[1];
    // First line: "listening on HOST:PORT ..."
    std::string line;
    char c;
    pollfd p{out[0], POLLIN, 0};
    while (line.find('\n') == std::string::npos) {
      if (poll(&p, 1, 60000) <= 0 || read(out[0], &c, 1) != 1) {
        throw std::runtime_error(s.name + " did not print its port: " + line);
      }
      line += c;
    }
    close(out[0]);
    auto at = line.find("127.0.0.1:");
    auto colon = at != std::string::npos ? at + 9 : line.rfind(':');
    s.port = static_cast<std::uint16_t>(std::stoi(line.substr(colon + 1)));
    return s;
  }

  // CPU seconds (user + system) the server has used so far, from /proc.
  double cpu_seconds() const {
    FILE* f = std::fopen(fmt::format("/proc/{}/stat", pid).c_str(), "r");
    if (!f) return 0;
    char buf[4096];
    std::size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    buf[n] = '\0';
    const char* p = std::strrchr(buf, ')');  // the command name may contain spaces
    unsigned long utime = 0, stime = 0;
    if (!p || std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) != 2) return 0;
    return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }

  // Waits (at most 10 s) until the server has used no CPU for 100 ms: after 10,000 clients
  // leave, a server may still be closing their connections, and both servers share CPU 1, so
  // the next measurement would otherwise pay for the previous server's clean-up.
  void wait_idle() const {
    double last = cpu_seconds();
    auto until = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // sampling /proc, not synchronising
      double now = cpu_seconds();
      if (now - last < 0.002) return;
      last = now;
    }
  }

  void stop() {
    if (pid < 0) return;
    close(stdin_fd);
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

// ---- the load generator -----------------------------------------------------------------------

std::string frame_set(const std::string& key, const std::string& value) {
  std::string f;
  wire::put_u8(f, *wire::encode_op(Op::kSet, Dialect::kV1));
  wire::put_str(f, key);
  wire::put_str(f, value);
  return f;
}
std::string frame_get(const std::string& key) {
  std::string f;
  wire::put_u8(f, *wire::encode_op(Op::kGet, Dialect::kV1));
  wire::put_str(f, key);
  return f;
}
std::string frame_add(const std::string& key, std::int64_t d) {
  std::string f;
  wire::put_u8(f, *wire::encode_op(Op::kAdd, Dialect::kV1));
  wire::put_str(f, key);
  wire::put_i64(f, d);
  return f;
}
std::string frame_wait(const std::string& key) {
  std::string f;
  wire::put_u8(f, *wire::encode_op(Op::kWait, Dialect::kV1));
  wire::put_u64(f, 1);
  wire::put_str(f, key);
  return f;
}

int make_socket() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + strerror(errno));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

void start_connect(int fd, std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 && errno != EINPROGRESS) {
    throw std::runtime_error(std::string("connect: ") + strerror(errno));
  }
}

void send_all(int fd, const std::string& b) {
  std::size_t off = 0;
  while (off < b.size()) {
    ssize_t n = send(fd, b.data() + off, b.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += n;
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 1000);
    } else {
      throw std::runtime_error(std::string("send: ") + strerror(errno));
    }
  }
}

struct Conn {
  int fd = -1;
  int step = 0;  // throughput: 0 = SET+GET in flight, 1 = ADD in flight
  std::string in;
  Clock::time_point sent;
  bool connected = false;
  int phase = 0;  // barrier: 0 connecting, 1 ADD sent, 2 WAIT sent, 3 released
};

// Bytes of a complete reply at the start of `in`, 0 if incomplete.
std::size_t reply_size(const std::string& in, bool is_get) {
  if (!is_get) return in.size() >= 8 ? 8 : 0;
  if (in.size() < 8) return 0;
  std::uint64_t len;
  std::memcpy(&len, in.data(), 8);
  return in.size() >= 8 + len ? 8 + len : 0;
}

struct Percentiles {
  double p50 = 0, p99 = 0;
};
Percentiles percentiles(std::vector<std::uint32_t>& us) {
  if (us.empty()) return {};
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2] / 1.0, us[std::min(us.size() - 1, us.size() * 99 / 100)] / 1.0};
}

struct ThroughputResult {
  double ops_per_s = 0;
  double server_us_per_op = 0;  // server CPU time per request: efficiency, whatever the client costs
  Percentiles setget, add;
};

ThroughputResult throughput(const Server& server, int nconns, double duration, int run) {
  const std::uint16_t port = server.port;
  int ep = epoll_create1(EPOLL_CLOEXEC);
  std::vector<Conn> conns(nconns);
  for (int i = 0; i < nconns; ++i) {
    conns[i].fd = make_socket();
    start_connect(conns[i].fd, port);
    pollfd p{conns[i].fd, POLLOUT, 0};
    poll(&p, 1, 10000);
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u32 = static_cast<std::uint32_t>(i);
    epoll_ctl(ep, EPOLL_CTL_ADD, conns[i].fd, &e);
  }
  const std::string value(64, 'v');
  const std::string counter = fmt::format("/bench{}/counter", run);
  std::vector<std::string> keys(nconns), setget(nconns);
  for (int i = 0; i < nconns; ++i) {
    keys[i] = fmt::format("/bench{}/key{}", run, i);
    setget[i] = frame_set(keys[i], value) + frame_get(keys[i]);
  }
  const std::string add = frame_add(counter, 1);

  std::vector<std::uint32_t> lat_setget, lat_add;
  lat_setget.reserve(1 << 20);
  lat_add.reserve(1 << 20);
  auto issue = [&](int i) {
    auto& c = conns[i];
    c.sent = Clock::now();
    send_all(c.fd, c.step == 0 ? setget[i] : add);
  };
  auto start = Clock::now();
  const auto warm_end = start + std::chrono::milliseconds(300);
  const auto end = warm_end + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(duration));
  std::uint64_t ops = 0, all_ops = 0;
  int in_flight = nconns;
  double cpu0 = server.cpu_seconds();
  for (int i = 0; i < nconns; ++i) issue(i);
  std::vector<epoll_event> events(1024);
  char buf[65536];
  while (in_flight > 0) {
    int n = epoll_wait(ep, events.data(), static_cast<int>(events.size()), 5000);
    if (n <= 0) throw std::runtime_error("throughput: no reply for 5 s");
    auto now = Clock::now();
    for (int k = 0; k < n; ++k) {
      auto& c = conns[events[k].data.u32];
      ssize_t got = recv(c.fd, buf, sizeof(buf), 0);
      if (got <= 0) throw std::runtime_error("throughput: server closed a connection");
      c.in.append(buf, got);
      std::size_t sz = reply_size(c.in, c.step == 0);
      if (sz == 0) continue;
      c.in.erase(0, sz);
      bool measured = c.sent >= warm_end && now <= end;
      if (measured) {
        auto us = static_cast<std::uint32_t>(std::chrono::duration_cast<std::chrono::microseconds>(now - c.sent).count());
        (c.step == 0 ? lat_setget : lat_add).push_back(us);
        ops += c.step == 0 ? 2 : 1;
      }
      all_ops += c.step == 0 ? 2 : 1;
      c.step ^= 1;
      if (now < end) {
        issue(static_cast<int>(events[k].data.u32));
      } else {
        --in_flight;
      }
    }
  }
  double cpu = server.cpu_seconds() - cpu0;
  for (auto& c : conns) close(c.fd);
  close(ep);
  ThroughputResult r;
  r.ops_per_s = ops / duration;
  r.server_us_per_op = all_ops ? cpu * 1e6 / all_ops : 0;
  r.setget = percentiles(lat_setget);
  r.add = percentiles(lat_add);
  return r;
}

struct BarrierResult {
  double connect_s = 0, total_s = 0;
};

BarrierResult barrier(std::uint16_t port, int n, int run) {
  int ep = epoll_create1(EPOLL_CLOEXEC);
  std::vector<Conn> conns(n);
  const std::string count_key = fmt::format("/barrier{}/count", run);
  const std::string go_key = fmt::format("/barrier{}/go", run);
  const std::string add = frame_add(count_key, 1);
  const std::string wait = frame_wait(go_key);
  const std::string release = frame_set(go_key, "1") + wait;
  // Connects in flight at once: more would overflow the listen backlog (net.core.somaxconn)
  // and cost SYN retransmits of a second, for either server alike.
  constexpr int kConnectWindow = 256;
  auto t0 = Clock::now();
  int next = 0, connecting = 0, connected = 0, released = 0;
  double connect_s = 0;
  auto open_more = [&] {
    while (next < n && connecting < kConnectWindow) {
      auto& c = conns[next];
      c.fd = make_socket();
      start_connect(c.fd, port);
      epoll_event e{};
      e.events = EPOLLOUT | EPOLLIN;
      e.data.u32 = static_cast<std::uint32_t>(next);
      epoll_ctl(ep, EPOLL_CTL_ADD, c.fd, &e);
      ++next;
      ++connecting;
    }
  };
  open_more();
  std::vector<epoll_event> events(4096);
  char buf[4096];
  while (released < n) {
    int k = epoll_wait(ep, events.data(), static_cast<int>(events.size()), 30000);
    if (k <= 0) throw std::runtime_error(fmt::format("barrier: stuck with {}/{} released", released, n));
    for (int j = 0; j < k; ++j) {
      auto idx = events[j].data.u32;
      auto& c = conns[idx];
      if (c.phase == 0 && (events[j].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) throw std::runtime_error(std::string("barrier connect: ") + strerror(err));
        epoll_event e{};
        e.events = EPOLLIN;
        e.data.u32 = idx;
        epoll_ctl(ep, EPOLL_CTL_MOD, c.fd, &e);
        --connecting;
        if (++connected == n) connect_s = seconds_since(t0);
        send_all(c.fd, add);
        c.phase = 1;
        open_more();
        continue;
      }
      if (!(events[j].events & EPOLLIN)) continue;
      ssize_t got = recv(c.fd, buf, sizeof(buf), 0);
      if (got <= 0) throw std::runtime_error("barrier: server closed a connection");
      c.in.append(buf, got);
      if (c.phase == 1 && c.in.size() >= 8) {
        std::int64_t v;
        std::memcpy(&v, c.in.data(), 8);
        c.in.erase(0, 8);
        send_all(c.fd, v == n ? release : wait);
        c.phase = 2;
      }
      if (c.phase == 2 && !c.in.empty()) {
        c.phase = 3;
        ++released;
      }
    }
  }
  BarrierResult r{connect_s, seconds_since(t0)};
  for (auto& c : conns) close(c.fd);
  close(ep);
  return r;
}

// ---- a misbehaving client, on its own thread, during one throughput point ---------------------

enum class Abuse { kNone, kSlowReader, kAmplifier };

const char* abuse_name(Abuse a) {
  switch (a) {
    case Abuse::kNone: return "none";
    case Abuse::kSlowReader: return "slow reader";
    case Abuse::kAmplifier: return "amplifier";
  }
  return "?";
}

// Peak resident memory of a process so far (VmHWM), MiB.
double peak_rss_mib(pid_t pid) {
  FILE* f = std::fopen(fmt::format("/proc/{}/status", pid).c_str(), "r");
  if (!f) return 0;
  char line[256];
  long kib = 0;
  while (std::fgets(line, sizeof(line), f)) {
    if (std::strncmp(line, "VmHWM:", 6) == 0) kib = std::atol(line + 6);
  }
  std::fclose(f);
  return kib / 1024.0;
}

// slow reader: SETs a 1 MiB value, then pipelines GETs of it (at most 1,000: 1 GiB of replies)
//              and never reads a reply.
// amplifier:   over and over (up to ~1,000 times a second): connect, MULTI_GET naming the
//              1 MiB key 1,000 times (1 GiB of reply), read whatever comes for 10 ms, disconnect. PyTorch 2.x numbering:
//              1.13's server has no MULTI_GET, so it is run against ddprun only.
class Abuser {
 public:
  Abuser(Abuse mode, std::uint16_t port) : mode_(mode), port_(port) {
    if (mode_ == Abuse::kNone) return;
    thread_ = std::thread([this] {
      pin_to_cpu(1);  // with the server: the abuse costs the server's host, not the generator
      try {
        mode_ == Abuse::kSlowReader ? slow_reader() : amplifier();
      } catch (const std::exception& e) {
        error_ = e.what();
      }
    });
  }
  ~Abuser() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) close(fd_);
  }
  long actions() const { return actions_; }

 private:
  int connect_blocking() {
    int fd = make_socket();
    start_connect(fd, port_);
    pollfd p{fd, POLLOUT, 0};
    poll(&p, 1, 5000);
    return fd;
  }
  // Sends until done or stopped; false when stopped (or the server closed us).
  bool send_some(int fd, const std::string& b) {
    std::size_t off = 0;
    while (off < b.size()) {
      if (stop_) return false;
      ssize_t n = send(fd, b.data() + off, b.size() - off, MSG_NOSIGNAL);
      if (n > 0) {
        off += static_cast<std::size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        pollfd p{fd, POLLOUT, 0};
        poll(&p, 1, 50);
      } else {
        return false;
      }
    }
    return true;
  }
  void slow_reader() {
    fd_ = connect_blocking();
    send_some(fd_, frame_set("/abuse/big", std::string(1 << 20, 'x')));
    std::string gets;
    for (int i = 0; i < 50; ++i) gets += frame_get("/abuse/big");
    for (int sent = 0; sent < 1000 && !stop_; sent += 50) {
      if (!send_some(fd_, gets)) break;
      actions_ += 50;
    }
    while (!stop_) std::this_thread::sleep_for(std::chrono::milliseconds(10));  // holds the connection, reads nothing
  }
  void amplifier() {
    std::string setup, attack;
    wire::put_u8(setup, 0);  // VALIDATE (2.x)
    wire::put_u32(setup, wire::kValidationMagic);
    wire::put_u8(setup, *wire::encode_op(Op::kSet, Dialect::kV2));
    wire::put_str(setup, "/abuse/big");
    wire::put_str(setup, std::string(1 << 20, 'x'));
    wire::put_u8(attack, 0);
    wire::put_u32(attack, wire::kValidationMagic);
    wire::put_u8(attack, *wire::encode_op(Op::kMultiGet, Dialect::kV2));
    wire::put_u64(attack, 1000);
    for (int i = 0; i < 1000; ++i) wire::put_str(attack, "/abuse/big");
    int fd = connect_blocking();
    send_some(fd, setup);
    close(fd);
    char buf[65536];
    while (!stop_) {
      fd = connect_blocking();
      if (send_some(fd, attack)) {
        auto until = Clock::now() + std::chrono::milliseconds(10);
        while (Clock::now() < until) {
          pollfd p{fd, POLLIN, 0};
          if (poll(&p, 1, 2) > 0 && recv(fd, buf, sizeof(buf), 0) <= 0) break;
        }
      }
      close(fd);
      ++actions_;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // pacing: at most ~1,000 attacks a second
    }
  }

  Abuse mode_;
  std::uint16_t port_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<long> actions_{0};
  int fd_ = -1;
  std::string error_;
};

std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  std::string str(s);
  std::size_t pos = 0;
  while (pos <= str.size()) {
    auto comma = str.find(',', pos);
    if (comma == std::string::npos) comma = str.size();
    if (comma > pos) v.push_back(std::stoi(str.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  double duration = 2.0;
  std::vector<int> conn_counts = {1, 64, 1024};
  std::vector<int> barrier_counts = {1000, 10000};
  int rounds = 1;
  int abuse_conns = 64;
  std::string store_bin = DDPRUN_STORE_BIN, torch_py = DDPRUN_TORCH_STORE_PY, python = "/usr/bin/python3";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        fmt::print(stderr, "store_bench: {} needs a value\n", a);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--duration") duration = std::stod(next());
    else if (a == "--conns") conn_counts = parse_list(next());
    else if (a == "--barrier") barrier_counts = parse_list(next());
    else if (a == "--rounds") rounds = std::stoi(next());
    else if (a == "--abuse_conns") abuse_conns = std::stoi(next());
    else if (a == "--store") store_bin = next();
    else if (a == "--python") python = next();
    else {
      fmt::print(stderr, "usage: store_bench [--duration S] [--conns 1,64,1024] [--barrier 1000,10000] [--rounds R] [--abuse_conns N (0: skip)]\n");
      return 2;
    }
  }
  pin_to_cpu(0);
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  signal(SIGPIPE, SIG_IGN);

  try {
    Server ours = Server::spawn("ddprun-store", {store_bin, "--host", "127.0.0.1", "--port", "0", "--log_level", "warn"});
    Server theirs = Server::spawn("torch 1.13 TCPStore", {python, torch_py});
    int run = 0;
    fmt::print("Store throughput: SET/GET/ADD mix, one request in flight per connection, {:.1f} s per point\n", duration);
    fmt::print("{:>6} | {:>13} | {:>13} | {:>6} | {:>23} | {:>23} | {:>17}\n", "conns", "ddprun ops/s", "torch ops/s",
               "ratio", "SET+GET p50/p99 us", "ADD p50/p99 us", "server CPU us/op");
    fmt::print("{:>6} | {:>13} | {:>13} | {:>6} | {:>23} | {:>23} | {:>17}\n", "", "", "", "", "ddprun / torch",
               "ddprun / torch", "ddprun / torch");
    for (int n : conn_counts) {
      for (int r = 0; r < rounds; ++r) {
        auto a = throughput(ours, n, duration, ++run);
        auto b = throughput(theirs, n, duration, ++run);
        fmt::print("{:>6} | {:>13.0f} | {:>13.0f} | {:>5.2f}x | {:>23} | {:>23} | {:>17}\n", n, a.ops_per_s,
                   b.ops_per_s, a.ops_per_s / b.ops_per_s,
                   fmt::format("{:.0f}/{:.0f} / {:.0f}/{:.0f}", a.setget.p50, a.setget.p99, b.setget.p50, b.setget.p99),
                   fmt::format("{:.0f}/{:.0f} / {:.0f}/{:.0f}", a.add.p50, a.add.p99, b.add.p50, b.add.p99),
                   fmt::format("{:.2f} / {:.2f}", a.server_us_per_op, b.server_us_per_op));
        std::fflush(stdout);
      }
    }
    fmt::print("\nBarrier: N clients connect, ADD, the last SETs, all WAIT (time from first connect to last release)\n");
    fmt::print("{:>6} | {:>16} | {:>16} | {:>6}\n", "N", "ddprun s", "torch s", "ratio");
    for (int n : barrier_counts) {
      for (int r = 0; r < rounds; ++r) {
        auto a = barrier(ours.port, n, ++run);
        ours.wait_idle();
        auto b = barrier(theirs.port, n, ++run);
        theirs.wait_idle();
        fmt::print("{:>6} | {:>16} | {:>16} | {:>5.1f}x\n", n,
                   fmt::format("{:.3f} (conn {:.3f})", a.total_s, a.connect_s),
                   fmt::format("{:.3f} (conn {:.3f})", b.total_s, b.connect_s), b.total_s / a.total_s);
        std::fflush(stdout);
      }
    }
    fmt::print("\nBarrier with access control off (--same_user false): the cost of the per-connection owner lookup\n");
    fmt::print("{:>6} | {:>16} | {:>16} | {:>6}\n", "N", "same_user on s", "off s", "ratio");
    {
      Server open = Server::spawn("ddprun-store (no access control)",
                                  {store_bin, "--host", "127.0.0.1", "--port", "0", "--log_level", "warn",
                                   "--same_user", "false"});
      for (int n : barrier_counts) {
        for (int r = 0; r < rounds; ++r) {
          auto a = barrier(ours.port, n, ++run);
          ours.wait_idle();
          auto b = barrier(open.port, n, ++run);
          open.wait_idle();
          fmt::print("{:>6} | {:>16.3f} | {:>16.3f} | {:>5.2f}x\n", n, a.total_s, b.total_s, a.total_s / b.total_s);
          std::fflush(stdout);
        }
      }
      open.stop();
    }
    if (abuse_conns > 0) {
      fmt::print("\nUnder abuse: {} well-behaved connections (as above) while one client misbehaves; ops/s and the\n"
                 "ratio to the undisturbed figure of the same server, measured just before; peak server RSS\n",
                 abuse_conns);
      fmt::print("{:>12} | {:>12} | {:>7} | {:>9} | {:>12} | {:>7} | {:>9}\n", "abuse", "ddprun ops/s", "vs none",
                 "peak RSS", "torch ops/s", "vs none", "peak RSS");
      double base_ours = 0, base_theirs = 0;
      for (Abuse mode : {Abuse::kNone, Abuse::kAmplifier, Abuse::kSlowReader}) {
        for (int r = 0; r < rounds; ++r) {
          ThroughputResult a, b;
          std::string theirs_text = "n/a", theirs_ratio = "", theirs_rss = "";
          {
            Abuser abuser(mode, ours.port);
            if (mode != Abuse::kNone) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // abuse under way
            a = throughput(ours, abuse_conns, duration, ++run);
          }
          if (mode == Abuse::kNone) base_ours = a.ops_per_s;
          if (mode != Abuse::kAmplifier) {  // 1.13's server has no MULTI_GET
            Abuser abuser(mode, theirs.port);
            if (mode != Abuse::kNone) std::this_thread::sleep_for(std::chrono::milliseconds(300));
            try {
              b = throughput(theirs, abuse_conns, duration, ++run);
              if (mode == Abuse::kNone) base_theirs = b.ops_per_s;
              theirs_text = fmt::format("{:.0f}", b.ops_per_s);
              theirs_ratio = fmt::format("{:.2f}x", base_theirs > 0 ? b.ops_per_s / base_theirs : 0);
            } catch (const std::exception& e) {
              theirs_text = "stalled";
              theirs_ratio = "0x";
            }
            theirs_rss = fmt::format("{:.0f} MiB", peak_rss_mib(theirs.pid));
          }
          fmt::print("{:>12} | {:>12.0f} | {:>6.2f}x | {:>9} | {:>12} | {:>7} | {:>9}\n", abuse_name(mode), a.ops_per_s,
                     base_ours > 0 ? a.ops_per_s / base_ours : 0, fmt::format("{:.0f} MiB", peak_rss_mib(ours.pid)),
                     theirs_text, theirs_ratio, theirs_rss);
          std::fflush(stdout);
        }
      }
    }
    ours.stop();
    theirs.stop();
  } catch (const std::exception& e) {
    fmt::print(stderr, "store_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
