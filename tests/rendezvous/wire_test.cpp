// Every opcode of both numberings at the byte level, through raw sockets.

#include <catch2/catch.hpp>

#include "helpers.hpp"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::test;

namespace {

const char* name(Dialect d) { return d == Dialect::kV1 ? "1.13" : "2.x"; }

}  // namespace

TEST_CASE("SET, GET, ADD and COMPARE_SET behave the same in both numberings", "[wire]") {
  TestServer server;
  auto d = GENERATE(Dialect::kV1, Dialect::kV2);
  INFO("numbering " << name(d));
  auto c = Raw::speaking(d, server.port());

  // SET then GET (1.13's first frame is a SET: opcode 0 without the magic)
  c.send(Frame(d, Op::kSet).str("k").str("v1"));
  c.send(Frame(d, Op::kGet).str("k"));
  CHECK(c.str() == "v1");
  // GET of a missing key answers empty (libuv behaviour)
  c.send(Frame(d, Op::kGet).str("missing"));
  CHECK(c.str().empty());

  // ADD creates, adds, accepts negative deltas
  c.send(Frame(d, Op::kAdd).str("n").i64(5));
  CHECK(c.i64() == 5);
  c.send(Frame(d, Op::kAdd).str("n").i64(-7));
  CHECK(c.i64() == -2);
  c.send(Frame(d, Op::kGet).str("n"));
  CHECK(c.str() == "-2");

  // COMPARE_SET, all four cases
  c.send(Frame(d, Op::kCompareSet).str("cs").str("").str("first"));
  CHECK(c.str() == "first");  // missing, expected empty: stored
  c.send(Frame(d, Op::kCompareSet).str("cs2").str("x").str("y"));
  CHECK(c.str() == "x");  // missing, expected non-empty: nothing stored, expected returned
  c.send(Frame(d, Op::kCheck).keys({"cs2"}));
  CHECK(c.u8() == wire::kNotReady);
  c.send(Frame(d, Op::kCompareSet).str("cs").str("wrong").str("z"));
  CHECK(c.str() == "first");  // present, not equal: current value
  c.send(Frame(d, Op::kCompareSet).str("cs").str("first").str("second"));
  CHECK(c.str() == "second");  // present, equal: replaced

}

TEST_CASE("CHECK, WAIT, GETNUMKEYS and DELETE_KEY behave the same in both numberings", "[wire]") {
  TestServer server;
  auto d = GENERATE(Dialect::kV1, Dialect::kV2);
  INFO("numbering " << name(d));
  auto c = Raw::speaking(d, server.port());
  c.send(Frame(d, Op::kSet).str("k").str("v1"));
  c.send(Frame(d, Op::kAdd).str("n").i64(-2));
  CHECK(c.i64() == -2);
  c.send(Frame(d, Op::kCompareSet).str("cs").str("").str("first"));
  CHECK(c.str() == "first");

  // CHECK
  c.send(Frame(d, Op::kCheck).keys({"k", "n"}));
  CHECK(c.u8() == wire::kReady);
  c.send(Frame(d, Op::kCheck).keys({"k", "nope"}));
  CHECK(c.u8() == wire::kNotReady);
  c.send(Frame(d, Op::kCheck).keys({}));
  CHECK(c.u8() == wire::kReady);

  // WAIT on present keys and on an empty list: answered at once
  c.send(Frame(d, Op::kWait).keys({"k", "n"}));
  CHECK(c.u8() == wire::kStopWaiting);
  c.send(Frame(d, Op::kWait).keys({}));
  CHECK(c.u8() == wire::kStopWaiting);

  // GETNUMKEYS: k, n, cs
  c.send(Frame(d, Op::kGetNumKeys));
  CHECK(c.i64() == 3);

  // DELETE_KEY answers 1, then 0
  c.send(Frame(d, Op::kDeleteKey).str("k"));
  CHECK(c.i64() == 1);
  c.send(Frame(d, Op::kDeleteKey).str("k"));
  CHECK(c.i64() == 0);
  c.send(Frame(d, Op::kGetNumKeys));
  CHECK(c.i64() == 2);

  // WAIT on a missing key is answered when another client sets it
  c.send(Frame(d, Op::kWait).keys({"late"}));
  Raw other = Raw::speaking(d, server.port());
  other.send(Frame(d, Op::kSet).str("late").str("x"));
  CHECK(c.u8() == wire::kStopWaiting);
}

TEST_CASE("a 1.13 SET whose key length begins with the magic's bytes is a SET", "[wire]") {
  TestServer server;
  Raw c(server.port());
  // Opcode 0 followed by bytes that are not the magic: parsed as a 1.13 SET.
  std::string key(300, 'a');  // length 300 = 2C 01 00 ...: not CE F7 85 3C
  c.send(Frame(Dialect::kV1, Op::kSet).str(key).str("v"));
  c.send(Frame(Dialect::kV1, Op::kGet).str(key));
  CHECK(c.str() == "v");
}

TEST_CASE("1.13 WATCH_KEY registers and pushes updates", "[wire]") {
  TestServer server;
  auto watcher = Raw::speaking(Dialect::kV1, server.port());
  watcher.send(Frame(Dialect::kV1, Op::kWatchKey).str("w"));
  CHECK(watcher.u8() == wire::kKeyCallbackRegistered);

  auto c = Raw::speaking(Dialect::kV1, server.port());
  c.send(Frame(Dialect::kV1, Op::kSet).str("w").str("one"));
  c.send(Frame(Dialect::kV1, Op::kSet).str("w").str("two"));
  c.send(Frame(Dialect::kV1, Op::kDeleteKey).str("w"));
  CHECK(c.i64() == 1);

  CHECK(watcher.u8() == wire::kKeyCreated);
  CHECK(watcher.str() == "w");
  CHECK(watcher.str().empty());
  CHECK(watcher.str() == "one");
  CHECK(watcher.u8() == wire::kKeyUpdated);
  CHECK(watcher.str() == "w");
  CHECK(watcher.str() == "one");
  CHECK(watcher.str() == "two");
  CHECK(watcher.u8() == wire::kKeyDeleted);
  CHECK(watcher.str() == "w");
  CHECK(watcher.str() == "two");
  CHECK(watcher.str().empty());
}

TEST_CASE("2.x-only opcodes: PING, APPEND, MULTI_SET and MULTI_GET", "[wire]") {
  TestServer server;
  const auto d = Dialect::kV2;
  auto c = Raw::speaking(d, server.port());

  SECTION("PING echoes its nonce") {
    c.send(Frame(d, Op::kPing).u32(0xDEADBEEF));
    CHECK(c.read<std::uint32_t>() == 0xDEADBEEF);
  }
  SECTION("APPEND creates and appends") {
    c.send(Frame(d, Op::kAppend).str("a").str("x"));
    c.send(Frame(d, Op::kAppend).str("a").str("yz"));
    c.send(Frame(d, Op::kGet).str("a"));
    CHECK(c.str() == "xyz");
  }
  SECTION("MULTI_SET then MULTI_GET, missing keys empty") {
    c.send(Frame(d, Op::kMultiSet).i64(2).str("m1").str("v1").str("m2").str("v2"));
    c.send(Frame(d, Op::kMultiGet).keys({"m2", "nope", "m1"}));
    CHECK(c.str() == "v2");
    CHECK(c.str().empty());
    CHECK(c.str() == "v1");
  }
}

TEST_CASE("2.x-only opcodes: CANCEL_WAIT, and WAIT on repeated and several keys", "[wire]") {
  TestServer server;
  const auto d = Dialect::kV2;
  auto c = Raw::speaking(d, server.port());

  SECTION("CANCEL_WAIT answers WAIT_CANCELED and the wait is gone") {
    c.send(Frame(d, Op::kWait).keys({"never"}));
    CHECK(c.ping_is_next());  // the WAIT is pending, not answered
    c.send(Frame(d, Op::kCancelWait));
    CHECK(c.u8() == wire::kWaitCanceled);
    Raw other = Raw::speaking(d, server.port());
    other.send(Frame(d, Op::kSet).str("never").str("now"));
    CHECK(other.ping_is_next());  // the SET has been applied
    CHECK(c.ping_is_next());      // and no STOP_WAITING reached the cancelled waiter
  }
  SECTION("CANCEL_WAIT without a pending wait still answers") {
    c.send(Frame(d, Op::kCancelWait));
    CHECK(c.u8() == wire::kWaitCanceled);
  }
  SECTION("QUEUE_PUSH, QUEUE_LEN, QUEUE_POP in FIFO order") {
    c.send(Frame(d, Op::kQueuePush).str("q").str("first"));
    c.send(Frame(d, Op::kQueuePush).str("q").str("second"));
    c.send(Frame(d, Op::kQueueLen).str("q"));
    CHECK(c.i64() == 2);
    c.send(Frame(d, Op::kCheck).keys({"q"}));
    CHECK(c.u8() == wire::kReady);
    c.send(Frame(d, Op::kQueuePop).str("q"));
    CHECK(c.i64() == 2);
    CHECK(c.str() == "first");
    c.send(Frame(d, Op::kQueuePop).str("q"));
    CHECK(c.i64() == 1);
    CHECK(c.str() == "second");
    c.send(Frame(d, Op::kQueuePop).str("q"));
    CHECK(c.i64() == 0);  // empty: no string follows
    c.send(Frame(d, Op::kQueueLen).str("q"));
    CHECK(c.i64() == 0);
  }
  SECTION("WAIT with a key twice is answered by one SET") {
    c.send(Frame(d, Op::kWait).keys({"dup", "dup"}));
    Raw other = Raw::speaking(d, server.port());
    other.send(Frame(d, Op::kSet).str("dup").str("v"));
    CHECK(c.u8() == wire::kStopWaiting);
  }
  SECTION("WAIT on two keys needs both") {
    c.send(Frame(d, Op::kWait).keys({"w1", "w2"}));
    Raw other = Raw::speaking(d, server.port());
    other.send(Frame(d, Op::kSet).str("w1").str("v"));
    CHECK(other.ping_is_next());
    CHECK(c.ping_is_next());  // still waiting for w2
    other.send(Frame(d, Op::kSet).str("w2").str("v"));
    CHECK(c.u8() == wire::kStopWaiting);
  }
}

TEST_CASE("WAIT is woken by every mutating operation", "[wire]") {
  TestServer server;
  const auto d = Dialect::kV2;
  auto waiter = Raw::speaking(d, server.port());
  auto other = Raw::speaking(d, server.port());
  std::string op;
  std::function<void()> mutate;
  SECTION("SET") { mutate = [&] { other.send(Frame(d, Op::kSet).str("key").str("v")); }; }
  SECTION("ADD") {
    mutate = [&] {
      other.send(Frame(d, Op::kAdd).str("key").i64(1));
      CHECK(other.i64() == 1);
    };
  }
  SECTION("APPEND") { mutate = [&] { other.send(Frame(d, Op::kAppend).str("key").str("v")); }; }
  SECTION("MULTI_SET") { mutate = [&] { other.send(Frame(d, Op::kMultiSet).i64(1).str("key").str("v")); }; }
  SECTION("COMPARE_SET") {
    mutate = [&] {
      other.send(Frame(d, Op::kCompareSet).str("key").str("").str("v"));
      CHECK(other.str() == "v");
    };
  }
  SECTION("QUEUE_PUSH") { mutate = [&] { other.send(Frame(d, Op::kQueuePush).str("key").str("v")); }; }

  waiter.send(Frame(d, Op::kWait).keys({"key"}));
  CHECK(waiter.ping_is_next());  // registered, not answered
  mutate();
  CHECK(waiter.u8() == wire::kStopWaiting);
}

TEST_CASE("1.13 and 2.x clients share one store", "[wire]") {
  TestServer server;
  auto old_client = Raw::speaking(Dialect::kV1, server.port());
  auto new_client = Raw::speaking(Dialect::kV2, server.port());
  old_client.send(Frame(Dialect::kV1, Op::kWait).keys({"shared"}));
  new_client.send(Frame(Dialect::kV2, Op::kAdd).str("shared").i64(41));
  CHECK(new_client.i64() == 41);
  CHECK(old_client.u8() == wire::kStopWaiting);
  old_client.send(Frame(Dialect::kV1, Op::kAdd).str("shared").i64(1));
  CHECK(old_client.i64() == 42);
}
