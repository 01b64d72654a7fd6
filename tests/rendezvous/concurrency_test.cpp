// Many clients at once: exact counters under contention, thousands of connections.

#include <catch2/catch.hpp>
#include <set>
#include <thread>

#include "ddprun/rendezvous/tcp_store.hpp"
#include "helpers.hpp"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::test;

TEST_CASE("64 threads x 1,000 ADDs give the exact total", "[concurrency]") {
  TestServer server;
  constexpr int kThreads = 64;
  constexpr int kAdds = 1000;
  std::vector<std::thread> threads;
  std::vector<std::int64_t> last(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      TcpStoreOptions o;
      o.host = "127.0.0.1";
      o.port = server.port();
      o.timeout = 60s;
      TcpStore s(o);
      for (int i = 0; i < kAdds; ++i) last[t] = s.add("total", 1);
    });
  }
  for (auto& t : threads) t.join();
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = server.port();
  TcpStore s(o);
  CHECK(s.get("total") == std::to_string(kThreads * kAdds));
  CHECK(*std::max_element(last.begin(), last.end()) == kThreads * kAdds);
}

TEST_CASE("2,000 concurrent connections each get a distinct ticket and are released together", "[concurrency]") {
  TestServer server;
  constexpr int kClients = 2000;
  std::vector<Raw> clients;
  clients.reserve(kClients);
  for (int i = 0; i < kClients; ++i) clients.push_back(Raw::speaking(Dialect::kV2, server.port()));
  // All connections are open at once; each takes a ticket, then waits for the release key.
  for (auto& c : clients) c.send(Frame(Dialect::kV2, Op::kAdd).str("ticket").i64(1));
  std::set<std::int64_t> tickets;
  for (auto& c : clients) tickets.insert(c.i64());
  CHECK(tickets.size() == kClients);
  CHECK(*tickets.begin() == 1);
  CHECK(*tickets.rbegin() == kClients);
  for (auto& c : clients) c.send(Frame(Dialect::kV2, Op::kWait).keys({"release"}));
  auto setter = Raw::speaking(Dialect::kV2, server.port());
  setter.send(Frame(Dialect::kV2, Op::kSet).str("release").str("go"));
  int released = 0;
  for (auto& c : clients) released += c.u8() == wire::kStopWaiting ? 1 : 0;
  CHECK(released == kClients);
}
