// The store's limits under clients that exceed them: the store quota, the connection cap,
// reserved descriptors, keep-alive, failures while serving one client, log flooding.
#include "abuse_helpers.hpp"

TEST_CASE("store quota (--max_store_bytes): a write over it fails for its client only - data stays intact", "[abuse]") {
  LogCapture logs;
  auto o = TestServer::with_loopback();
  o.max_store_bytes = 64 * 1024;
  TestServer server(o);
  auto a = Raw::speaking(Dialect::kV2, server.port());
  a.send(Frame(Dialect::kV2, Op::kSet).str("first").str(std::string(40000, '1')));
  CHECK(a.ping_is_next());
  auto b = Raw::speaking(Dialect::kV2, server.port());
  b.send(Frame(Dialect::kV2, Op::kSet).str("second").str(std::string(40000, '2')));
  CHECK(b.closed_by_server());
  // Refused either as the whole SET (store_core: "SET on key 'second' ... nothing was changed") or,
  // where the 40,000 bytes arrive in several reads, while it is still being received
  // ("the request it is sending"): both name the limit, and the checks below prove nothing changed.
  auto refused = logs.await_lines_with({"over --max_store_bytes=65536"});
  REQUIRE(refused.size() == 1);
  CHECK((refused[0].find("SET on key 'second'") != std::string::npos ||
         refused[0].find("the request it is sending") != std::string::npos));
  // Queues and appends count too.
  auto q = Raw::speaking(Dialect::kV2, server.port());
  q.send(Frame(Dialect::kV2, Op::kQueuePush).str("q").str(std::string(30000, 'q')));
  CHECK(q.closed_by_server());
  a.send(Frame(Dialect::kV2, Op::kGet).str("first"));
  CHECK(a.str() == std::string(40000, '1'));
  a.send(Frame(Dialect::kV2, Op::kGet).str("second"));
  CHECK(a.str().empty());
  a.send(Frame(Dialect::kV2, Op::kQueueLen).str("q"));
  CHECK(a.i64() == 0);
  // Overwriting within the quota, and deleting, free room.
  a.send(Frame(Dialect::kV2, Op::kSet).str("first").str(std::string(100, '1')));
  a.send(Frame(Dialect::kV2, Op::kSet).str("second").str(std::string(40000, '2')));
  CHECK(a.ping_is_next());
  CHECK(server.stats().store_bytes == 5 + 100 + 6 + 40000);
  a.send(Frame(Dialect::kV2, Op::kDeleteKey).str("second"));
  CHECK(a.i64() == 1);
  CHECK(server.stats().store_bytes == 5 + 100);
}

TEST_CASE("connection cap (--max_connections): the next client is refused at once - logged at most once a second", "[abuse]") {
  LogCapture logs;
  auto o = TestServer::with_loopback();
  o.max_connections = 8;
  TestServer server(o);
  std::vector<Raw> in_;
  for (int i = 0; i < 8; ++i) {
    in_.push_back(Raw::speaking(Dialect::kV2, server.port()));
    CHECK(in_.back().ping_is_next());
  }
  for (int i = 0; i < 5; ++i) {
    auto extra = Raw::speaking(Dialect::kV2, server.port());
    CHECK(extra.closed_by_server());
  }
  CHECK(logs.await_lines_with({"refused", "the limit of --max_connections"}).size() == 1);
  CHECK(server.stats().refused_connections == 5);
  in_.pop_back();  // one leaves: room for one more
  bool served = false;
  for (int attempt = 0; attempt < 50 && !served; ++attempt) {
    try {
      auto again = Raw::speaking(Dialect::kV2, server.port());
      served = again.ping_is_next();
    } catch (const ddprun::Error&) {
      std::this_thread::sleep_for(10ms);  // the server has not seen the close yet
    }
  }
  CHECK(served);
}

TEST_CASE("descriptors are kept in reserve for the process hosting the store", "[abuse]") {
  // 64 descriptors, 32 of them reserved: the store takes at most 32 minus its own.
  StoreProcess store({"--reserved_fds", "32", "--log_level", "info"}, {"prlimit", "--nofile=64:64"});
  std::vector<Raw> clients;
  int served = 0;
  for (int i = 0; i < 48; ++i) {
    clients.push_back(Raw::speaking(Dialect::kV2, store.port()));
    try {
      if (clients.back().ping_is_next()) ++served;
    } catch (const ddprun::Error&) {
    }
  }
  INFO("served " << served);
  CHECK(served > 10);
  CHECK(served <= 32);
  CHECK(store.count_in_log("are kept for the hosting process") >= 1);
  // The store itself still works for a newcomer once one leaves.
  clients.clear();
  bool ok = false;
  for (int attempt = 0; attempt < 50 && !ok; ++attempt) {
    try {
      ok = Raw::speaking(Dialect::kV2, store.port()).ping_is_next();
    } catch (const ddprun::Error&) {
      std::this_thread::sleep_for(10ms);
    }
  }
  CHECK(ok);
}

TEST_CASE("TCP keep-alive is on for every client connection", "[abuse]") {
  auto o = TestServer::with_loopback();
  o.tcp_keepalive_idle = std::chrono::seconds(7);
  TestServer server(o);
  auto c = Raw::speaking(Dialect::kV2, server.port());
  CHECK(c.ping_is_next());
  // /proc/net/tcp: the server's end (local port = the store's) shows timer 2, keep-alive.
  std::ifstream f("/proc/net/tcp");
  std::string line;
  char port_hex[8];
  std::snprintf(port_hex, sizeof(port_hex), "%04X", server.port());
  bool found = false, keepalive = false;
  std::getline(f, line);
  while (std::getline(f, line)) {
    std::istringstream ss(line);
    std::string sl, local, remote, st, queues, timer;
    ss >> sl >> local >> remote >> st >> queues >> timer;
    if (local.substr(local.find(':') + 1) == port_hex && st == "01") {
      found = true;
      keepalive = timer.rfind("02:", 0) == 0;
    }
  }
  CHECK(found);
  CHECK(keepalive);
}

TEST_CASE("an exception while serving one client closes that client only - nothing is applied twice",
          "[abuse]") {
  LogCapture logs;
  auto o = TestServer::with_loopback();
  o.on_request = [](std::string_view, std::string_view key) {
    if (key == "boom") throw std::bad_alloc();
    if (key == "oops") throw std::runtime_error("unexpected");
  };
  TestServer server(o);
  for (const char* trigger : {"boom", "oops"}) {
    auto a = Raw::speaking(Dialect::kV2, server.port());
    std::string counter = std::string("count-") + trigger;
    // Pipelined: ADD, the failing SET, ADD. Only the first ADD may take effect, once.
    a.send(Frame(Dialect::kV2, Op::kAdd).str(counter).i64(1).bytes() +
           Frame(Dialect::kV2, Op::kSet).str(trigger).str("x").bytes() +
           Frame(Dialect::kV2, Op::kAdd).str(counter).i64(1).bytes());
    CHECK(a.i64() == 1);
    CHECK(a.closed_by_server());
    auto b = Raw::speaking(Dialect::kV2, server.port());
    b.send(Frame(Dialect::kV2, Op::kAdd).str(counter).i64(0));
    CHECK(b.i64() == 1);
    CHECK(b.ping_is_next());
  }
  CHECK(logs.await_lines_with({"out of memory while applying its SET request"}).size() == 1);
  CHECK(logs.await_lines_with({"internal error while applying its SET request: unexpected"}).size() == 1);
}

TEST_CASE("a client repeating an abuse cannot flood the log", "[abuse]") {
  LogCapture logs;
  TestServer server;
  for (int i = 0; i < 100; ++i) {
    auto bad = Raw::speaking(Dialect::kV2, server.port());
    bad.send(std::string("\x11", 1));  // unknown opcode
    CHECK(bad.closed_by_server());
  }
  CHECK(logs.lines_with({"closing connection from"}).size() <= 20);
  // The count left out is reported with the next warning after the one-second window.
  std::this_thread::sleep_for(1100ms);  // the window is wall time by design
  auto bad = Raw::speaking(Dialect::kV2, server.port());
  bad.send(std::string("\x11", 1));
  CHECK(bad.closed_by_server());
  CHECK(logs.await_lines_with({"80 more warnings about client connections in the last second were not logged"}).size() == 1);
}
