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
  SECTION("fewer than 5 bytes starting with zero: wait for more") {
    RequestParser p;
    auto res = p.parse(std::string("\0\xCE\xF7", 3), r);
    CHECK(res.status == Status::kNeedMore);
    CHECK(res.need == 5);
    CHECK(p.dialect() == Dialect::kUnknown);
  }
}

TEST_CASE("every prefix of a request asks for more, the whole request completes", "[parser]") {
  std::string frame = Frame(Dialect::kV2, Op::kMultiSet).i64(2).str("a").str("1").str("bb").str("22").bytes();
  for (std::size_t cut = 1; cut < frame.size(); ++cut) {
    RequestParser p;
    Request r;
    p.parse(Frame(Dialect::kV2, Op::kValidate).u32(wire::kValidationMagic), r);
    auto res = p.parse(std::string_view(frame).substr(0, cut), r);
    INFO("cut at " << cut);
    REQUIRE(res.status == Status::kNeedMore);
    CHECK(res.need > cut);
    CHECK(res.need <= frame.size());
  }
  RequestParser p;
  Request r;
  p.parse(Frame(Dialect::kV2, Op::kValidate).u32(wire::kValidationMagic), r);
  auto res = p.parse(frame, r);
  REQUIRE(res.status == Status::kComplete);
  CHECK(res.consumed == frame.size());
  CHECK(r.keys == std::vector<std::string>{"a", "bb"});
  CHECK(r.values == std::vector<std::string>{"1", "22"});
}

TEST_CASE("a large value asks for its whole length at once", "[parser]") {
  RequestParser p;
  Request r;
  std::string frame = Frame(Dialect::kV1, Op::kSet).str("k").str(std::string(1 << 20, 'x')).bytes();
  auto res = p.parse(std::string_view(frame).substr(0, 100), r);
  REQUIRE(res.status == Status::kNeedMore);
  CHECK(res.need == frame.size());
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
