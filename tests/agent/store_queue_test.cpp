// StoreQueue (control/store_queue.hpp): the exchanges' requests to the workers' store, in order,
// on one thread over one kept connection, made again after a failure.
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <string>
#include <vector>

#include "control/store_queue.hpp"
#include "ddprun/rendezvous/store_server.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"

using namespace ddprun::agent;
using ddprun::rendezvous::StoreServer;
using ddprun::rendezvous::StoreServerOptions;
using ddprun::rendezvous::TcpStore;

TEST_CASE("store queue: requests run in order over one kept connection, a failure answered and the next request connects again", "[units]") {
  StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  StoreServer server(o);
  server.start();
  StoreQueue queue;
  std::vector<std::int64_t> seen;
  std::promise<void> done;
  for (int i = 0; i < 20; ++i) {
    queue.post("127.0.0.1", server.port(), [&seen](TcpStore& store) { seen.push_back(store.add("k", 1)); });
  }
  queue.post("127.0.0.1", server.port(), [&](TcpStore& store) {
    seen.push_back(store.add("k", 0));
    done.set_value();
  });
  REQUIRE(done.get_future().wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  std::vector<std::int64_t> want;
  for (int i = 1; i <= 20; ++i) want.push_back(i);
  want.push_back(20);
  CHECK(seen == want);  // in order
  CHECK(server.stats().connections == 1);  // one connection for all 21

  // A request that throws is answered with why; the next one gets a connection of its own.
  std::promise<std::string> failed;
  queue.post("127.0.0.1", server.port(), [](TcpStore&) { throw std::runtime_error("planted"); },
             [&](const std::string& why) { failed.set_value(why); });
  auto why = failed.get_future();
  REQUIRE(why.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(why.get() == "planted");
  std::promise<std::int64_t> after;
  queue.post("127.0.0.1", server.port(), [&](TcpStore& store) { after.set_value(store.add("k", 0)); });
  auto count = after.get_future();
  REQUIRE(count.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(count.get() == 20);
  server.stop();
}
