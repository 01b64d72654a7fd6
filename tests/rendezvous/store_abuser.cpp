// store_abuser: clients for the shell tests of ddprun-store, run as other users (setpriv) where
// the test needs it. Plain sockets, 2.x numbering.
//
//   store_abuser plant PORT N   N times: connect, VALIDATE + SET "/planted/<uid>/<i>", close at
//                               once (no reply awaited); prints "sent N"
//   store_abuser legit PORT KEY connect, VALIDATE + SET KEY + PING, wait for the echo, close
//   store_abuser count PORT     the store's key count (GETNUMKEYS after a PING round trip, on a
//                               new connection each of two times, so that every connection
//                               accepted before it has been served); prints the number
// Exit 0 on success, 1 on a failure (printed).

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "ddprun/common/error.hpp"
#include "ddprun/rendezvous/protocol.hpp"
#include "socket.hpp"

namespace {

namespace wire = ddprun::rendezvous::wire;
using ddprun::rendezvous::Clock;
using ddprun::rendezvous::Socket;
using wire::Dialect;
using wire::Op;

std::uint8_t op(Op o) { return *wire::encode_op(o, Dialect::kV2); }

std::string hello() {
  std::string f;
  wire::put_u8(f, op(Op::kValidate));
  wire::put_u32(f, wire::kValidationMagic);
  return f;
}

std::string set(const std::string& key, const std::string& value) {
  std::string f;
  wire::put_u8(f, op(Op::kSet));
  wire::put_str(f, key);
  wire::put_str(f, value);
  return f;
}

std::string ping() {
  std::string f;
  wire::put_u8(f, op(Op::kPing));
  wire::put_u32(f, 0x51A7E);
  return f;
}

Clock::time_point in_seconds(int s) { return Clock::now() + std::chrono::seconds(s); }

// Connects, retrying for up to 10 s (a throttled store accepts slowly).
Socket connect_to(std::uint16_t port) {
  auto until = in_seconds(10);
  for (;;) {
    try {
      return Socket::connect("127.0.0.1", port, until);
    } catch (const ddprun::Error&) {
      if (Clock::now() >= until) throw;
    }
  }
}

void expect_echo(Socket& s) {
  std::uint32_t echo = 0;
  s.recv_exact(&echo, sizeof(echo), in_seconds(30));
  if (echo != 0x51A7E) throw std::runtime_error("PING answered with a wrong nonce");
}

std::int64_t count_keys(std::uint16_t port) {
  auto s = connect_to(port);
  std::string req = hello() + ping();
  wire::put_u8(req, op(Op::kGetNumKeys));
  s.send_all(req, in_seconds(30));
  expect_echo(s);
  std::int64_t n = 0;
  s.recv_exact(&n, sizeof(n), in_seconds(30));
  return n;
}

int run(int argc, char** argv) {
  std::string cmd = argc > 1 ? argv[1] : "";
  auto port = static_cast<std::uint16_t>(argc > 2 ? std::atoi(argv[2]) : 0);
  if (cmd == "plant" && argc == 4) {
    int n = std::atoi(argv[3]);
    std::string prefix = "/planted/" + std::to_string(::getuid()) + "/";
    for (int i = 0; i < n; ++i) {
      auto s = connect_to(port);
      s.send_all(hello() + set(prefix + std::to_string(i), "x"), in_seconds(5));
    }  // each socket closes here, before the store has answered anything
    std::printf("sent %d\n", n);
    return 0;
  }
  if (cmd == "legit" && argc == 4) {
    auto s = connect_to(port);
    s.send_all(hello() + set(argv[3], "x") + ping(), in_seconds(5));
    expect_echo(s);
    return 0;
  }
  if (cmd == "count" && argc == 3) {
    auto first = count_keys(port);
    std::printf("%lld\n", static_cast<long long>(std::max(first, count_keys(port))));
    return 0;
  }
  std::fprintf(stderr, "usage: store_abuser plant PORT N | legit PORT KEY | count PORT\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_abuser: %s\n", e.what());
    return 1;
  }
}
