// The request parser alone: dialect detection, partial frames, limits.

#include <catch2/catch.hpp>

#include "helpers.hpp"
#include "request_parser.hpp"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::test;
using Status = RequestParser::Status;

TEST_CASE("the first byte and the magic decide the dialect", "[parser]") {
  Request r;
  SECTION("VALIDATE with the magic: 2.x") {
    RequestParser p;
    auto res = p.parse(Frame(Dialect::kV2, Op::kValidate).u32(wire::kValidationMagic), r);
    CHECK(res.status == Status::kComplete);
    CHECK(res.consumed == 5);
    CHECK(p.dialect() == Dialect::kV2);
  }
  SECTION("a non-zero first byte: 1.13") {
    RequestParser p;
    auto res = p.parse(Frame(Dialect::kV1, Op::kAdd).str("init/").i64(1), r);
    CHECK(res.status == Status::kComplete);
    CHECK(p.dialect() == Dialect::kV1);
    CHECK(r.op == Op::kAdd);
    CHECK(r.keys == std::vector<std::string>{"init/"});
    CHECK(r.delta == 1);
  }
  SECTION("zero without the magic: a 1.13 SET") {
    RequestParser p;
    auto res = p.parse(Frame(Dialect::kV1, Op::kSet).str("key").str("value"), r);
    CHECK(res.status == Status::kComplete);
    CHECK(p.dialect() == Dialect::kV1);
    CHECK(r.op == Op::kSet);
    CHECK(r.values == std::vector<std::string>{"value"});
  }
  SECTION("fewer than 5 bytes starting with zero: wait for more, then decide") {
    RequestParser p;
    std::string frame = Frame(Dialect::kV2, Op::kValidate).u32(wire::kValidationMagic).bytes();
    auto res = p.parse(std::string_view(frame).substr(0, 3), r);
    CHECK(res.status == Status::kNeedMore);
    CHECK(res.consumed == 3);
    CHECK(p.dialect() == Dialect::kUnknown);
    res = p.parse(std::string_view(frame).substr(3), r);
    CHECK(res.status == Status::kComplete);
    CHECK(res.consumed == 2);
    CHECK(p.dialect() == Dialect::kV2);
  }
}

TEST_CASE("a request split anywhere, or fed a byte at a time, parses the same", "[parser]") {
  std::string frame = Frame(Dialect::kV2, Op::kMultiSet).i64(2).str("a").str("1").str("bb").str("22").bytes();
  auto fresh = [] {
    RequestParser p;
    Request r;
    p.parse(Frame(Dialect::kV2, Op::kValidate).u32(wire::kValidationMagic), r);
    return p;
  };
  for (std::size_t cut = 1; cut < frame.size(); ++cut) {
    INFO("cut at " << cut);
    auto p = fresh();
    Request r;
    auto res = p.parse(std::string_view(frame).substr(0, cut), r);
    REQUIRE(res.status == Status::kNeedMore);
    CHECK(res.consumed == cut);
    CHECK(p.partial_bytes() == cut);
    res = p.parse(std::string_view(frame).substr(cut), r);
    REQUIRE(res.status == Status::kComplete);
    CHECK(res.consumed == frame.size() - cut);
    CHECK(r.keys == std::vector<std::string>{"a", "bb"});
    CHECK(r.values == std::vector<std::string>{"1", "22"});
    CHECK(p.partial_bytes() == 0);
  }
  auto p = fresh();
  Request r;
  for (std::size_t i = 0; i + 1 < frame.size(); ++i) {
    REQUIRE(p.parse(std::string_view(frame).substr(i, 1), r).status == Status::kNeedMore);
  }
  REQUIRE(p.parse(std::string_view(frame).substr(frame.size() - 1), r).status == Status::kComplete);
  CHECK(r.op == Op::kMultiSet);
  CHECK(r.values == std::vector<std::string>{"1", "22"});
}

TEST_CASE("two requests in one buffer: the first completes and the rest is left", "[parser]") {
  RequestParser p;
  Request r;
  std::string two = Frame(Dialect::kV1, Op::kAdd).str("x").i64(5).bytes() + Frame(Dialect::kV1, Op::kGet).str("y").bytes();
  auto res = p.parse(two, r);
  REQUIRE(res.status == Status::kComplete);
  CHECK(r.op == Op::kAdd);
  CHECK(r.delta == 5);
  res = p.parse(std::string_view(two).substr(res.consumed), r);
  REQUIRE(res.status == Status::kComplete);
  CHECK(r.op == Op::kGet);
  CHECK(r.keys == std::vector<std::string>{"y"});
}

// The old parser re-read a request from its first byte whenever more arrived: a request
// trickled in small pieces cost O(size^2). Each byte is now examined once.
TEST_CASE("parsing cost is linear however the bytes are split", "[parser]") {
  wire::WireLimits lim;
  lim.max_keys_per_request = 200000;
  std::vector<std::string> keys;
  for (int i = 0; i < 100000; ++i) keys.push_back("key" + std::to_string(i));
  std::string frame = Frame(Dialect::kV2, Op::kWait).keys(keys).bytes();  // ~1.7 MB
  RequestParser p(lim);
  Request r;
  p.parse(Frame(Dialect::kV2, Op::kValidate).u32(wire::kValidationMagic), r);
  auto t0 = std::chrono::steady_clock::now();
  RequestParser::Result res{Status::kNeedMore, 0, {}};
  for (std::size_t i = 0; i < frame.size(); ++i) res = p.parse(std::string_view(frame).substr(i, 1), r);
  auto took = std::chrono::steady_clock::now() - t0;
  REQUIRE(res.status == Status::kComplete);
  CHECK(r.keys.size() == 100000);
  CHECK(r.keys.back() == "key99999");
  // Linear: well under a second for 1.7 million one-byte calls (quadratic would be hours).
  CHECK(took < std::chrono::seconds(2));
}

TEST_CASE("limits and malformed requests are rejected with a reason", "[parser]") {
  wire::WireLimits lim;
  lim.max_key_bytes = 16;
  lim.max_value_bytes = 32;
  lim.max_keys_per_request = 4;
  RequestParser p(lim);
  Request r;
  p.parse(Frame(Dialect::kV2, Op::kValidate).u32(wire::kValidationMagic), r);
  struct Case {
    std::string frame;
    std::string reason;
  };
  std::vector<Case> cases = {
      {Frame(Dialect::kV2, Op::kSet).str(std::string(17, 'k')).str("v").bytes(), "key of 17 bytes exceeds the limit of 16"},
      {Frame(Dialect::kV2, Op::kSet).str("k").str(std::string(33, 'v')).bytes(), "value of 33 bytes exceeds the limit of 32"},
      {Frame(Dialect::kV2, Op::kWait).keys({"a", "b", "c", "d", "e"}).bytes(), "5 keys, over the limit of 4"},
      {Frame(Dialect::kV2, Op::kMultiSet).i64(-1).bytes(), "negative count"},
      {std::string("\x11", 1), "unknown opcode 17"},
      {Frame(Dialect::kV2, Op::kValidate).u32(1).bytes(), "bad validation magic"},
      // a length near 2^64 must not overflow the bounds checks
      {Frame(Dialect::kV2, Op::kGet).u64(~std::uint64_t{0}).bytes(), "exceeds the limit"},
  };
  for (const auto& c : cases) {
    INFO(c.reason);
    auto res = p.parse(c.frame, r);
    CHECK(res.status == Status::kInvalid);
    CHECK_THAT(res.error, Catch::Contains(c.reason));
  }
  RequestParser v1;
  auto res = v1.parse(std::string("\x09", 1), r);
  CHECK(res.status == Status::kInvalid);
  CHECK_THAT(res.error, Catch::Contains("unknown opcode 9 (PyTorch 1.13 numbering)"));
}
