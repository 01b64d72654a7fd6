#include "store_bench_abuse.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "ddprun/rendezvous/protocol.hpp"
#include "store_bench_client.hpp"
#include "store_bench_server.hpp"

namespace store_bench {
namespace {

namespace wire = ddprun::rendezvous::wire;
using wire::Dialect;
using wire::Op;

// VALIDATE (2.x) then one request.
std::string v2(Op op) {
  std::string f;
  wire::put_u8(f, 0);
  wire::put_u32(f, wire::kValidationMagic);
  wire::put_u8(f, *wire::encode_op(op, Dialect::kV2));
  return f;
}

}  // namespace

const char* abuse_name(Abuse a) {
  switch (a) {
    case Abuse::kNone: return "none";
    case Abuse::kSlowReader: return "slow reader";
    case Abuse::kAmplifier: return "amplifier";
  }
  return "?";
}

Abuser::Abuser(Abuse mode, std::uint16_t port) : mode_(mode), port_(port) {
  if (mode_ == Abuse::kNone) return;
  thread_ = std::thread([this] {
    pin_to_cpu(1);  // with the server: the abuse costs the server's host, not the generator
    try {
      mode_ == Abuse::kSlowReader ? slow_reader() : amplifier();
    } catch (const std::exception&) {
      // the abuser gave up (the server closed it): the throughput point goes on without it
    }
  });
}

Abuser::~Abuser() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) close(fd_);
}

// Sends until done or stopped; false when stopped (or the server closed us).
bool Abuser::send_some(int fd, const std::string& b) {
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

void Abuser::slow_reader() {
  fd_ = connect_blocking(port_);
  send_some(fd_, frame_set("/abuse/big", std::string(1 << 20, 'x')));
  std::string gets;
  for (int i = 0; i < 50; ++i) gets += frame_get("/abuse/big");
  for (int sent = 0; sent < 1000 && !stop_; sent += 50) {
    if (!send_some(fd_, gets)) break;
  }
  while (!stop_) std::this_thread::sleep_for(std::chrono::milliseconds(10));  // holds the connection, reads nothing
}

void Abuser::amplifier() {
  std::string setup = v2(Op::kSet), attack = v2(Op::kMultiGet);
  wire::put_str(setup, "/abuse/big");
  wire::put_str(setup, std::string(1 << 20, 'x'));
  wire::put_u64(attack, 1000);
  for (int i = 0; i < 1000; ++i) wire::put_str(attack, "/abuse/big");
  int fd = connect_blocking(port_);
  send_some(fd, setup);
  close(fd);
  char buf[65536];
  while (!stop_) {
    fd = connect_blocking(port_);
    if (send_some(fd, attack)) {
      auto until = Clock::now() + std::chrono::milliseconds(10);
      while (Clock::now() < until) {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 2) > 0 && recv(fd, buf, sizeof(buf), 0) <= 0) break;
      }
    }
    close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // pacing: at most ~1,000 attacks a second
  }
}

}  // namespace store_bench
