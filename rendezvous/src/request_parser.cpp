#include "request_parser.hpp"

#include <cstring>
#include <string>

namespace ddprun::rendezvous {
namespace {

using wire::Op;

struct NeedMore {
  std::size_t need;
};
struct Invalid {
  std::string why;
};

// A bounds-checked cursor. Running out of bytes throws NeedMore with the size the request needs
// at least, so the caller waits for that many bytes before parsing again (a 8 MiB value arriving
// in 64 KiB reads is parsed once, not 128 times).
class Cursor {
 public:
  explicit Cursor(std::string_view in) : in_(in) {}

  template <typename T>
  T read_int() {
    require(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  void read_str(std::string& out, std::size_t max, const char* what, const WireLimits& limits) {
    auto len = read_int<std::uint64_t>();
    if (len > max) {
      throw Invalid{std::string(what) + " of " + std::to_string(len) + " bytes exceeds the limit of " +
                    std::to_string(max) + " bytes"};
    }
    check_total(len, limits);
    require(len);
    out.assign(in_.data() + pos_, len);
    pos_ += len;
  }

  std::size_t read_count(std::uint64_t n, const WireLimits& limits) {
    if (n > limits.max_keys_per_request) {
      throw Invalid{"request names " + std::to_string(n) + " keys, over the limit of " +
                    std::to_string(limits.max_keys_per_request)};
    }
    return static_cast<std::size_t>(n);
  }

  std::size_t pos() const { return pos_; }

 private:
  void require(std::size_t n) {
    if (in_.size() - pos_ < n) throw NeedMore{pos_ + n};
  }
  void check_total(std::uint64_t len, const WireLimits& limits) const {
    if (pos_ + len > limits.max_request_bytes) {
      throw Invalid{"request of over " + std::to_string(pos_ + len) + " bytes exceeds the limit of " +
                    std::to_string(limits.max_request_bytes) + " bytes"};
    }
  }

  std::string_view in_;
  std::size_t pos_ = 0;
};

// resize() keeps the vectors' capacity and their strings' buffers from earlier requests.
void parse_body(Cursor& c, Request& r, const WireLimits& lim) {
  const std::size_t kmax = lim.max_key_bytes;
  const std::size_t vmax = lim.max_value_bytes;
  switch (r.op) {
    case Op::kValidate:
    case Op::kPing:
      r.keys.resize(0);
      r.values.resize(0);
      r.u32 = c.read_int<std::uint32_t>();
      return;
    case Op::kGetNumKeys:
    case Op::kCancelWait:
      r.keys.resize(0);
      r.values.resize(0);
      return;
    case Op::kGet:
    case Op::kDeleteKey:
    case Op::kWatchKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
      r.keys.resize(1);
      r.values.resize(0);
      c.read_str(r.keys[0], kmax, "key", lim);
      return;
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      r.keys.resize(1);
      r.values.resize(1);
      c.read_str(r.keys[0], kmax, "key", lim);
      c.read_str(r.values[0], vmax, "value", lim);
      return;
    case Op::kCompareSet:
      r.keys.resize(1);
      r.values.resize(2);
      c.read_str(r.keys[0], kmax, "key", lim);
      c.read_str(r.values[0], vmax, "expected value", lim);
      c.read_str(r.values[1], vmax, "desired value", lim);
      return;
    case Op::kAdd:
      r.keys.resize(1);
      r.values.resize(0);
      c.read_str(r.keys[0], kmax, "key", lim);
      r.delta = c.read_int<std::int64_t>();
      return;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet: {
      auto n = c.read_count(c.read_int<std::uint64_t>(), lim);
      r.values.resize(0);
      r.keys.resize(n);
      for (auto& k : r.keys) c.read_str(k, kmax, "key", lim);
      return;
    }
    case Op::kMultiSet: {
      auto raw = c.read_int<std::int64_t>();
      if (raw < 0) throw Invalid{"MULTI_SET with a negative count " + std::to_string(raw)};
      auto n = c.read_count(static_cast<std::uint64_t>(raw), lim);
      r.keys.resize(n);
      r.values.resize(n);
      for (std::size_t i = 0; i < n; ++i) {
        c.read_str(r.keys[i], kmax, "key", lim);
        c.read_str(r.values[i], vmax, "value", lim);
      }
      return;
    }
  }
}

}  // namespace

RequestParser::Result RequestParser::parse(std::string_view in, Request& out) {
  if (in.empty()) return {Status::kNeedMore, 0, 1, {}};
  auto byte = static_cast<std::uint8_t>(in[0]);
  try {
    if (dialect_ == wire::Dialect::kUnknown) {
      if (byte != 0) {
        dialect_ = wire::Dialect::kV1;
      } else {
        // 0x00 is VALIDATE in 2.x and SET in 1.13. Reading 4 more bytes is always safe: a 1.13
        // SET carries at least 16 more (two u64 lengths).
        if (in.size() < 5) return {Status::kNeedMore, 0, 5, {}};
        std::uint32_t magic;
        std::memcpy(&magic, in.data() + 1, 4);
        dialect_ = magic == wire::kValidationMagic ? wire::Dialect::kV2 : wire::Dialect::kV1;
      }
    }
    auto op = wire::decode_op(byte, dialect_);
    if (!op) {
      return {Status::kInvalid, 0, 0,
              "unknown opcode " + std::to_string(byte) +
                  (dialect_ == wire::Dialect::kV1 ? " (PyTorch 1.13 numbering)" : " (PyTorch 2.x numbering)")};
    }
    out.op = *op;
    Cursor c(in.substr(1));
    parse_body(c, out, limits_);
    if (out.op == Op::kValidate && out.u32 != wire::kValidationMagic) {
      return {Status::kInvalid, 0, 0, "bad validation magic " + std::to_string(out.u32)};
    }
    return {Status::kComplete, 1 + c.pos(), 0, {}};
  } catch (const NeedMore& m) {
    return {Status::kNeedMore, 0, 1 + m.need, {}};
  } catch (Invalid& e) {
    return {Status::kInvalid, 0, 0, std::move(e.why)};
  }
}

}  // namespace ddprun::rendezvous
