// The TcpStore client and PrefixStore against the server.

#include <sys/socket.h>
#include <netinet/in.h>

#include <catch2/catch.hpp>
#include <thread>

#include "ddprun/common/error.hpp"
#include "skip.hpp"
#include "ddprun/rendezvous/prefix_store.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"
#include "helpers.hpp"
#include "loopback.hpp"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::test;

namespace {

TcpStoreOptions client_of(std::uint16_t port, std::chrono::milliseconds timeout = 10s) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout = timeout;
  return o;
}

}  // namespace

TEST_CASE("TcpStore: every operation", "[client]") {
  TestServer server;
  TcpStore s(client_of(server.port()));
  s.set("a", "1");
  CHECK(s.get("a") == "1");
  CHECK(s.add("n", 3) == 3);
  CHECK(s.add("n", -1) == 2);
  CHECK(s.compare_set("a", "1", "2") == "2");
  CHECK(s.compare_set("a", "1", "3") == "2");
  CHECK(s.compare_set("fresh", "", "x") == "x");
  CHECK(s.compare_set("absent", "e", "x") == "e");
  CHECK(s.check({"a", "n"}));
  CHECK_FALSE(s.check({"a", "absent"}));
  s.wait({"a", "n"});
  CHECK(s.num_keys() == 3);
  CHECK(s.delete_key("a"));
  CHECK_FALSE(s.delete_key("a"));
  s.append("log", "x");
  s.append("log", "y");
  CHECK(s.get("log") == "xy");
  s.multi_set({"m1", "m2"}, {"v1", std::string("\0\xff", 2)});
  CHECK(s.multi_get({"m1", "m2", "none"}) == std::vector<std::string>{"v1", std::string("\0\xff", 2), ""});
  CHECK(s.ping(1s));
  CHECK_THROWS_AS(s.multi_set({"a"}, {}), ddprun::UsageError);
}

TEST_CASE("TcpStore keys carry PyTorch's '/' prefix on the wire", "[client]") {
  TestServer server;
  TcpStore s(client_of(server.port()));
  s.set("k", "v");
  auto raw = Raw::speaking(Dialect::kV2, server.port());
  raw.send(Frame(Dialect::kV2, Op::kGet).str("/k"));
  CHECK(raw.str() == "v");
}

TEST_CASE("TcpStore::get waits for a key set later by another client", "[client]") {
  TestServer server;
  TcpStore waiter(client_of(server.port()));
  std::thread setter([&] {
    TcpStore s(client_of(server.port()));
    s.wait({"ready"});  // the waiter is in its get by the time this is set
    s.set("late", "value");
  });
  waiter.set("ready", "1");
  CHECK(waiter.get("late") == "value");
  setter.join();
}

TEST_CASE("TcpStore timeouts name the keys, the server and the duration, and keep the connection", "[client]") {
  TestServer server;
  TcpStore s(client_of(server.port()));
  auto t0 = Clock::now();
  try {
    s.wait({"never", "nor_this"}, 150ms);
    FAIL("wait did not time out");
  } catch (const ddprun::TimeoutError& e) {
    std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("'never'"));
    CHECK_THAT(msg, Catch::Contains("'nor_this'"));
    CHECK_THAT(msg, Catch::Contains("127.0.0.1:" + std::to_string(server.port())));
    CHECK_THAT(msg, Catch::Contains("150 ms"));
  }
  auto took = Clock::now() - t0;
  CHECK(took >= 150ms);
  CHECK(took < 2s);
  // CANCEL_WAIT kept the connection in step: later calls work and see no stale reply.
  s.set("never", "now");
  CHECK(s.get("never") == "now");
  CHECK(s.add("c", 1) == 1);

  s.set_timeout(100ms);
  CHECK_THROWS_AS(s.get("missing"), ddprun::TimeoutError);
  CHECK(s.add("c", 1) == 2);
}

TEST_CASE("TcpStore: a listener that is not a store is named as such - one that answers at once, one that never does",
          "[client]") {
  std::uint16_t port = 0;
  const int fd = ddprun::test::listen_loopback(port);
  REQUIRE(fd >= 0);
  SECTION("an HTTP server's answer: refused at once") {
    std::thread http([fd] {
      const int c = ::accept(fd, nullptr, nullptr);
      const char reply[] = "HTTP/1.0 400 Bad Request\r\n\r\n";
      (void)!::write(c, reply, sizeof(reply) - 1);
      ::close(c);
    });
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(TcpStore(client_of(port, 20s)), Catch::Contains("answered the store's handshake with something else") &&
                                                          Catch::Contains("not a ddprun or PyTorch c10d store"));
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
    http.join();
  }
  SECTION("no answer (the connection taken, held): the time-out says something else is there") {
    CHECK_THROWS_WITH(TcpStore(client_of(port, 300ms)), Catch::Contains("never answered: a store too loaded") &&
                                                           !Catch::Contains("(check"));
    // Where the client was pointed here by settings, they are named (a worker's MASTER_ADDR).
    auto o = client_of(port, 300ms);
    o.pointed_by = "MASTER_ADDR, MASTER_PORT";
    CHECK_THROWS_WITH(TcpStore(o), Catch::Contains("not a ddprun or PyTorch c10d store (check MASTER_ADDR, MASTER_PORT)?"));
  }
  ::close(fd);
}

TEST_CASE("TcpStore: connecting retries until the server starts, and times out clearly", "[client]") {
  // Hold a port without listening: connecting is refused until we let the server have it.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::uint16_t port = ntohs(addr.sin_port);

  SECTION("times out with the address in the message") {
    try {
      TcpStore s(client_of(port, 300ms));
      FAIL("connected to nothing");
    } catch (const ddprun::TimeoutError& e) {
      CHECK_THAT(e.what(), Catch::Contains("127.0.0.1:" + std::to_string(port)));
      CHECK_THAT(e.what(), Catch::Contains("is the store running"));
    }
    ::close(fd);
  }
  SECTION("connects once the server is up") {
    std::unique_ptr<TcpStore> client;
    std::thread t([&] { client = std::make_unique<TcpStore>(client_of(port, 20s)); });
    ::close(fd);
    auto o = TestServer::with_loopback();
    o.port = port;
    TestServer server(o);
    t.join();
    client->set("k", "v");
    CHECK(client->get("k") == "v");
  }
}

TEST_CASE("PrefixStore joins prefix and key with '/'", "[client]") {
  TestServer server;
  auto base = std::make_shared<TcpStore>(client_of(server.port()));
  PrefixStore a("attempt_0", base);
  PrefixStore b("attempt_1", base);
  a.set("rank", "0");
  b.set("rank", "1");
  CHECK(a.get("rank") == "0");
  CHECK(b.get("rank") == "1");
  CHECK(base->get("attempt_0/rank") == "0");
  PrefixStore nested("inner", std::make_shared<PrefixStore>("outer", base));
  nested.set("k", "v");
  CHECK(base->get("outer/inner/k") == "v");
  CHECK(a.add("n", 2) == 2);
  CHECK(a.compare_set("n", "2", "5") == "5");
  CHECK(a.check({"rank", "n"}));
  a.wait({"rank"});
  a.multi_set({"x", "y"}, {"1", "2"});
  CHECK(a.multi_get({"x", "y"}) == std::vector<std::string>{"1", "2"});
  a.append("x", "1");
  CHECK(base->get("attempt_0/x") == "11");
  CHECK(a.delete_key("x"));
  CHECK_FALSE(base->check({"attempt_0/x"}));
}

TEST_CASE("the server listens on IPv6 loopback", "[client]") {
  StoreServerOptions o;
  o.host = "::1";
  std::unique_ptr<TestServer> server;
  try {
    server = std::make_unique<TestServer>(o);
  } catch (const ddprun::NetworkError& e) {
    // No IPv6 on this machine (a kernel or container without it) is missing hardware, not a tool.
    SKIP_UNLESS_HARDWARE(false, std::string("IPv6 loopback unavailable here: ") + e.what());
  }
  TcpStoreOptions c;
  c.host = "::1";
  c.port = server->port();
  c.timeout = 5s;
  TcpStore s(c);
  s.set("v6", "yes");
  CHECK(s.get("v6") == "yes");
  CHECK(s.address() == "[::1]:" + std::to_string(server->port()));
}

TEST_CASE("binding a port in use fails with the address and a hint", "[client]") {
  TestServer first;
  auto o = TestServer::with_loopback();
  o.port = first.port();
  try {
    StoreServer second(o);
    FAIL("bound a port in use");
  } catch (const ddprun::NetworkError& e) {
    CHECK_THAT(e.what(), Catch::Contains("127.0.0.1:" + std::to_string(first.port())));
    CHECK_THAT(e.what(), Catch::Contains("in use"));
  }
}
