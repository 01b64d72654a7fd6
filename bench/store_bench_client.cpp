#include "store_bench_client.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "ddprun/rendezvous/protocol.hpp"

namespace store_bench {
namespace {

namespace wire = ddprun::rendezvous::wire;
using wire::Op;

std::string opcode(Op op) {
  std::string f;
  wire::put_u8(f, *wire::encode_op(op, wire::Dialect::kV1));
  return f;
}

}  // namespace

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string frame_set(const std::string& key, const std::string& value) {
  std::string f = opcode(Op::kSet);
  wire::put_str(f, key);
  wire::put_str(f, value);
  return f;
}

std::string frame_get(const std::string& key) {
  std::string f = opcode(Op::kGet);
  wire::put_str(f, key);
  return f;
}

std::string frame_add(const std::string& key, std::int64_t delta) {
  std::string f = opcode(Op::kAdd);
  wire::put_str(f, key);
  wire::put_i64(f, delta);
  return f;
}

std::string frame_wait(const std::string& key) {
  std::string f = opcode(Op::kWait);
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

void start_connect(int fd, std::uint16_t port, int source) {
  if (source >= 0) {
    // An explicit source: the kernel's own port choice searches the ephemeral range, which is
    // quadratic once thousands of ports are taken (or in TIME_WAIT from the last barrier).
    // 127.0.0.(2 + source / 20000), port 10000 + source % 20000, the next one where taken.
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in s{};
    s.sin_family = AF_INET;
    s.sin_addr.s_addr = htonl(INADDR_LOOPBACK + 1 + static_cast<std::uint32_t>(source / 20000));
    int tries = 0;
    for (int p = source % 20000;; p = (p + 1) % 20000) {
      s.sin_port = htons(static_cast<std::uint16_t>(10000 + p));
      if (bind(fd, reinterpret_cast<sockaddr*>(&s), sizeof(s)) == 0) break;
      if (errno != EADDRINUSE || ++tries == 20000) {
        throw std::runtime_error(std::string("bind 127.0.0.x: ") + strerror(errno));
      }
    }
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 && errno != EINPROGRESS) {
    throw std::runtime_error(std::string("connect: ") + strerror(errno));
  }
}

int connect_blocking(std::uint16_t port) {
  int fd = make_socket();
  start_connect(fd, port);
  pollfd p{fd, POLLOUT, 0};
  poll(&p, 1, 5000);
  return fd;
}

void send_all(int fd, const std::string& b) {
  std::size_t off = 0;
  while (off < b.size()) {
    ssize_t n = send(fd, b.data() + off, b.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<std::size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 1000);
    } else {
      throw std::runtime_error(std::string("send: ") + strerror(errno));
    }
  }
}

std::size_t reply_size(const std::string& in, bool is_get) {
  if (!is_get) return in.size() >= 8 ? 8 : 0;
  if (in.size() < 8) return 0;
  std::uint64_t len;
  std::memcpy(&len, in.data(), 8);
  return in.size() >= 8 + len ? 8 + len : 0;
}

}  // namespace store_bench
