// A bad client hurts only itself: its connection is closed with one log line naming it and the
// reason, and a well-behaved client on the same server keeps working.

#include <catch2/catch.hpp>

#include <thread>

#include "ddprun/common/error.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"
#include "helpers.hpp"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::test;

namespace {

StoreServerOptions small_limits() {
  auto o = TestServer::with_loopback();
  o.limits.max_key_bytes = 64;
  o.limits.max_value_bytes = 1024;
  o.limits.max_keys_per_request = 16;
  o.max_reply_bytes = 64 * 1024;
  o.output_high_water_bytes = 16 * 1024;
  o.max_pending_output_bytes = 256 * 1024;
  return o;
}

void check_good_client_works(std::uint16_t port) {
  auto good = client(port);
  good.set("still", "fine");
  CHECK(good.get("still") == "fine");
  CHECK(good.add("counter", 1) >= 1);
}

}  // namespace

TEST_CASE("bad requests close only their own connection - with one log line", "[robustness]") {
  LogCapture logs;
  TestServer server(small_limits());
  auto good = Raw::speaking(Dialect::kV2, server.port());
  good.send(Frame(Dialect::kV2, Op::kSet).str("before").str("1"));

  struct Case {
    const char* name;
    Dialect dialect;
    std::string bytes;
    const char* reason;
  };
  auto v2 = Dialect::kV2;
  auto v1 = Dialect::kV1;
  std::vector<Case> cases = {
      {"unknown 2.x opcode", v2, std::string("\x11", 1), "unknown opcode 17"},
      {"unknown 1.13 opcode", v1, std::string("\x0D\x00\x00\x00\x00", 5), "unknown opcode 13"},
      {"bad magic", v2, Frame(v2, Op::kValidate).u32(0x12345678).bytes(), "bad validation magic"},
      {"key over the limit", v2, Frame(v2, Op::kSet).str(std::string(65, 'k')).str("v").bytes(),
       "key of 65 bytes exceeds the limit of 64"},
      {"value over the limit", v2, Frame(v2, Op::kSet).str("k").str(std::string(1025, 'v')).bytes(),
       "value of 1025 bytes exceeds the limit of 1024"},
      {"too many keys", v2, Frame(v2, Op::kMultiGet).keys(std::vector<std::string>(17, "k")).bytes(),
       "17 keys, over the limit of 16"},
      {"huge length", v1, Frame(v1, Op::kGet).u64(~std::uint64_t{0}).bytes(), "exceeds the limit"},
      {"ADD on a non-numeric value", v2,
       Frame(v2, Op::kSet).str("text").str("abc").bytes() + Frame(v2, Op::kAdd).str("text").i64(1).bytes(),
       "not a decimal integer"},
      {"ADD overflow", v2,
       Frame(v2, Op::kSet).str("big").str("9223372036854775807").bytes() + Frame(v2, Op::kAdd).str("big").i64(1).bytes(),
       "overflows"},
  };
  for (const auto& c : cases) {
    SECTION(c.name) {
      auto bad = Raw::speaking(c.dialect, server.port());
      bad.send(c.bytes);
      CHECK(bad.closed_by_server());
      auto lines = logs.lines_with({"closing connection from 127.0.0.1:", c.reason});
      CHECK(lines.size() == 1);
      // the good connection, opened before, and a new client are unaffected
      good.send(Frame(Dialect::kV2, Op::kGet).str("before"));
      CHECK(good.str() == "1");
      check_good_client_works(server.port());
    }
  }
}

TEST_CASE("a failed ADD leaves the value as it was", "[robustness]") {
  TestServer server;
  auto bad = Raw::speaking(Dialect::kV2, server.port());
  bad.send(Frame(Dialect::kV2, Op::kSet).str("text").str("abc"));
  bad.send(Frame(Dialect::kV2, Op::kAdd).str("text").i64(1));
  CHECK(bad.closed_by_server());
  auto c = Raw::speaking(Dialect::kV2, server.port());
  c.send(Frame(Dialect::kV2, Op::kGet).str("text"));
  CHECK(c.str() == "abc");
}

TEST_CASE("the client reports a server-side rejection as a network error", "[robustness]") {
  TestServer server;
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = server.port();
  o.timeout = 5s;
  TcpStore s(o);
  s.set("text", "abc");
  try {
    s.add("text", 1);
    FAIL("ADD on text succeeded");
  } catch (const ddprun::NetworkError& e) {
    CHECK_THAT(e.what(), Catch::Contains("ADD '/text'") || Catch::Contains("ADD 'text'"));
  }
  // the client reconnects for the next call
  CHECK(s.get("text") == "abc");
}

TEST_CASE("a client vanishing mid-request or mid-WAIT is logged and forgotten", "[robustness]") {
  LogCapture logs;
  TestServer server;
  SECTION("truncated frame") {
    auto bad = Raw::speaking(Dialect::kV2, server.port());
    std::string frame = Frame(Dialect::kV2, Op::kSet).str("key").str("value").bytes();
    bad.send(frame.substr(0, frame.size() - 2));
    // Vanish: our end is closed for writing; the server logs, then closes, which we see.
    ::shutdown(bad.socket().fd(), SHUT_WR);
    CHECK(bad.closed_by_server());
    check_good_client_works(server.port());
    CHECK(logs.await_lines_with({"127.0.0.1:", "disconnected in the middle of a request"}).size() == 1);
  }
  SECTION("pending WAIT") {
    auto bad = Raw::speaking(Dialect::kV2, server.port());
    bad.send(Frame(Dialect::kV2, Op::kWait).keys({"never"}));
    CHECK(bad.ping_is_next());
    ::shutdown(bad.socket().fd(), SHUT_WR);
    CHECK(bad.closed_by_server());
    // Setting the key afterwards must not touch the dead connection.
    check_good_client_works(server.port());
    TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = server.port();
    TcpStore s(o);
    s.set("never", "now");
    CHECK(s.get("never") == "now");
    CHECK(logs.await_lines_with({"127.0.0.1:", "disconnected with 1 pending WAIT"}).size() == 1);
  }
}

TEST_CASE("a client that never reads its replies is paused - loses nothing - and stalls nobody", "[robustness]") {
  TestServer server(small_limits());
  auto greedy = Raw::speaking(Dialect::kV2, server.port());
  const std::string value(1024, 'x');
  greedy.send(Frame(Dialect::kV2, Op::kSet).str("big").str(value));
  // 20,000 GETs ask for 20 MiB of replies: far beyond socket buffers and the 256 KiB bound.
  std::string burst;
  for (int i = 0; i < 20000; ++i) burst += Frame(Dialect::kV2, Op::kGet).str("big").bytes();
  // Send without reading, from another thread: once the server stops reading us, our send blocks.
  std::thread sender([&] {
    try {
      greedy.socket().send_all(burst, in(20s));
    } catch (const ddprun::Error&) {
    }
  });
  struct Join {
    std::thread& t;
    ~Join() { if (t.joinable()) t.join(); }
  } join{sender};
  check_good_client_works(server.port());
  // Every reply arrives, in order, once we read.
  for (int i = 0; i < 20000; ++i) {
    auto got = greedy.str();
    if (got != value) FAIL("reply " << i << " is wrong (" << got.size() << " bytes)");
  }
  CHECK(greedy.ping_is_next());
}

TEST_CASE("a client that lets notifications pile up past the cap is dropped with one log line", "[robustness]") {
  LogCapture logs;
  TestServer server(small_limits());
  // 1.13 WATCH_KEY: every SET of the key sends the watcher old and new value (~2 KiB).
  auto watcher = Raw::speaking(Dialect::kV1, server.port());
  watcher.send(Frame(Dialect::kV1, Op::kWatchKey).str("w"));
  CHECK(watcher.u8() == ddprun::rendezvous::wire::kKeyCallbackRegistered);
  auto writer = Raw::speaking(Dialect::kV2, server.port());
  for (int i = 0; i < 10000; ++i) writer.send(Frame(Dialect::kV2, Op::kSet).str("w").str(std::string(1000, static_cast<char>('a' + i % 26))));
  CHECK(writer.ping_is_next());
  // 10,000 x 2 KiB = 20 MiB unread: past socket buffers and the 256 KiB cap; the writer went on.
  check_good_client_works(server.port());
  CHECK(watcher.closed_by_server());
  CHECK(logs.await_lines_with({"does not read its replies", "over the limit of 262144"}).size() == 1);
}
