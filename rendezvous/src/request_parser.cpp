#include "request_parser.hpp"

#include <cstring>
#include <string>

#include "memory_budget.hpp"

namespace ddprun::rendezvous {
namespace {

using wire::Op;
using F = RequestParser::Field;

struct Invalid {
  std::string why;
};

constexpr F kU32[] = {F::kU32};
constexpr F kKeyOnly[] = {F::kKey};
constexpr F kKeyValue[] = {F::kKey, F::kValue};
constexpr F kCompareSet[] = {F::kKey, F::kExpected, F::kDesired};
constexpr F kAdd[] = {F::kKey, F::kI64};
constexpr F kCount[] = {F::kCount};
constexpr F kSignedCount[] = {F::kSignedCount};

const char* field_name(F f) {
  switch (f) {
    case F::kKey: return "key";
    case F::kValue: return "value";
    case F::kExpected: return "expected value";
    case F::kDesired: return "desired value";
    default: return "field";
  }
}

std::size_t vector_heap(const std::vector<std::string>& v) {
  return cost::malloc_bytes(v.capacity() * sizeof(std::string));
}

}  // namespace

std::size_t key_heap_bytes(const Request& r) {
  std::size_t n = vector_heap(r.keys);
  for (const auto& k : r.keys) n += cost::string_heap(k);
  return n;
}

std::size_t heap_bytes(const Request& r) {
  std::size_t n = key_heap_bytes(r) + vector_heap(r.values);
  for (const auto& v : r.values) n += cost::string_heap(v);
  return n;
}

void RequestParser::start(Op op) {
  req_.op = op;
  in_request_ = true;
  idx_ = 0;
  count_ = 0;
  nkeys_ = nvalues_ = 0;
  in_string_ = false;
  fixed_ = nullptr;
  fixed_len_ = 0;
  repeat_ = nullptr;
  repeat_len_ = 0;
  auto set = [&](const F* f, std::size_t n) {
    fixed_ = f;
    fixed_len_ = n;
  };
  switch (op) {
    case Op::kValidate:
    case Op::kPing: set(kU32, 1); break;
    case Op::kGetNumKeys:
    case Op::kCancelWait: break;
    case Op::kGet:
    case Op::kDeleteKey:
    case Op::kWatchKey:
    case Op::kQueuePop:
    case Op::kQueueLen: set(kKeyOnly, 1); break;
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush: set(kKeyValue, 2); break;
    case Op::kCompareSet: set(kCompareSet, 3); break;
    case Op::kAdd: set(kAdd, 2); break;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      set(kCount, 1);
      repeat_ = kKeyOnly;
      repeat_len_ = 1;
      break;
    case Op::kMultiSet:
      set(kSignedCount, 1);
      repeat_ = kKeyValue;
      repeat_len_ = 2;
      break;
  }
}

bool RequestParser::take_int(std::string_view& in, std::size_t n) {
  std::size_t take = std::min(n - ihave_, in.size());
  std::memcpy(ibuf_ + ihave_, in.data(), take);
  ihave_ += take;
  total_ += take;
  in.remove_prefix(take);
  return ihave_ == n;
}

std::uint64_t RequestParser::int_value() const {
  std::uint64_t v = 0;
  std::memcpy(&v, ibuf_, 8);  // little-endian hosts: a u32 is the low half (ibuf_ zero-padded)
  return v;
}

RequestParser::Field RequestParser::field() const {
  return idx_ < fixed_len_ ? fixed_[idx_] : repeat_[(idx_ - fixed_len_) % repeat_len_];
}

void RequestParser::finish_field() {
  ++idx_;
  ihave_ = 0;
  std::memset(ibuf_, 0, sizeof(ibuf_));
  in_string_ = false;
}

std::string& RequestParser::target(Field f) {
  // Reuse the strings of earlier requests (their buffers), adding one only when needed.
  auto& list = f == F::kKey ? req_.keys : req_.values;
  auto& n = f == F::kKey ? nkeys_ : nvalues_;
  if (list.size() <= n) {
    held_ -= vector_heap(list);
    list.emplace_back();
    held_ += vector_heap(list);
  }
  auto& s = list[n++];
  s.clear();
  return s;
}

// The opcode (and, for the first request of a connection starting with byte 0, the dialect).
// False when `in` ran out first.
bool RequestParser::begin_request(std::string_view& in) {
  if (!in_request_) {
    if (in.empty()) return false;
    auto byte = static_cast<std::uint8_t>(in[0]);
    in.remove_prefix(1);
    total_ = 1;
    if (dialect_ == wire::Dialect::kUnknown && byte == 0) {
      // 0x00 is VALIDATE in 2.x and SET in 1.13: the next 4 bytes tell (the magic, or the low
      // half of a 1.13 key length).
      sniffing_ = true;
      in_request_ = true;
      ihave_ = 0;
      std::memset(ibuf_, 0, sizeof(ibuf_));
    } else {
      if (dialect_ == wire::Dialect::kUnknown) dialect_ = wire::Dialect::kV1;
      auto op = wire::decode_op(byte, dialect_);
      if (!op) {
        throw Invalid{"unknown opcode " + std::to_string(byte) +
                      (dialect_ == wire::Dialect::kV1 ? " (PyTorch 1.13 numbering)" : " (PyTorch 2.x numbering)")};
      }
      start(*op);
      std::memset(ibuf_, 0, sizeof(ibuf_));
      ihave_ = 0;
    }
  }
  if (!sniffing_) return true;
  if (!take_int(in, 4)) return false;
  sniffing_ = false;
  std::uint32_t magic = static_cast<std::uint32_t>(int_value());
  if (magic == wire::kValidationMagic) {
    dialect_ = wire::Dialect::kV2;
    start(Op::kValidate);
    req_.u32 = magic;
    finish_field();
  } else {
    dialect_ = wire::Dialect::kV1;
    start(Op::kSet);  // the 4 bytes stay in the accumulator: half of the key length
  }
  return true;
}

// The field at idx_. False when `in` ran out first.
bool RequestParser::take_field(std::string_view& in) {
  F f = field();
  switch (f) {
    case F::kU32:
      if (!take_int(in, 4)) return false;
      req_.u32 = static_cast<std::uint32_t>(int_value());
      break;
    case F::kI64:
      if (!take_int(in, 8)) return false;
      req_.delta = static_cast<std::int64_t>(int_value());
      break;
    case F::kCount:
    case F::kSignedCount: {
      if (!take_int(in, 8)) return false;
      std::uint64_t n = int_value();
      if (f == F::kSignedCount && static_cast<std::int64_t>(n) < 0) {
        throw Invalid{"MULTI_SET with a negative count " + std::to_string(static_cast<std::int64_t>(n))};
      }
      if (n > limits_.max_keys_per_request) {
        throw Invalid{"request names " + std::to_string(n) + " keys, over the limit of " +
                      std::to_string(limits_.max_keys_per_request)};
      }
      count_ = n;
      break;
    }
    default:
      if (!take_string(in, f)) return false;
      break;
  }
  finish_field();
  if (total_ > limits_.max_request_bytes) {
    throw Invalid{"request of over " + std::to_string(total_) + " bytes exceeds the limit of " +
                  std::to_string(limits_.max_request_bytes) + " bytes"};
  }
  return true;
}

// A string field: u64 length (checked before any byte is stored), then the bytes.
bool RequestParser::take_string(std::string_view& in, Field f) {
  if (!in_string_) {
    if (!take_int(in, 8)) return false;
    std::uint64_t len = int_value();
    std::size_t max = f == F::kKey ? limits_.max_key_bytes : limits_.max_value_bytes;
    if (len > max) {
      throw Invalid{std::string(field_name(f)) + " of " + std::to_string(len) + " bytes exceeds the limit of " +
                    std::to_string(max) + " bytes"};
    }
    if (total_ + len > limits_.max_request_bytes) {
      throw Invalid{"request of over " + std::to_string(total_ + len) + " bytes exceeds the limit of " +
                    std::to_string(limits_.max_request_bytes) + " bytes"};
    }
    target(f);
    in_string_ = true;
    remaining_ = len;
  }
  auto& s = (f == F::kKey ? req_.keys[nkeys_ - 1] : req_.values[nvalues_ - 1]);
  std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(remaining_, in.size()));
  if (s.size() + take > s.capacity()) {
    // Grow geometrically but never past the declared length, so that a complete value holds
    // exactly its bytes (it becomes the store's buffer as it is).
    std::size_t want = std::min<std::uint64_t>(s.size() + remaining_, std::max(s.size() + take, 2 * s.capacity()));
    std::string grown;
    grown.reserve(want);
    grown.append(s);
    held_ += cost::string_heap(grown) - cost::string_heap(s);
    s.swap(grown);
  }
  s.append(in.data(), take);
  in.remove_prefix(take);
  remaining_ -= take;
  total_ += take;
  return remaining_ == 0;
}

RequestParser::Result RequestParser::parse(std::string_view in, Request& out, std::size_t out_heap) {
  const std::size_t given = in.size();
  try {
    if (!begin_request(in)) return {Status::kNeedMore, given, {}};
    while (!done()) {
      if (!take_field(in)) return {Status::kNeedMore, given, {}};
    }
    if (req_.op == Op::kValidate && req_.u32 != wire::kValidationMagic) {
      throw Invalid{"bad validation magic " + std::to_string(req_.u32)};
    }
    req_.keys.resize(nkeys_);
    req_.values.resize(nvalues_);
    std::swap(out, req_);
    std::size_t done = held_;
    held_ = out_heap == kUnknown ? heap_bytes(req_) : out_heap;  // the storage `out` had
    in_request_ = false;
    total_ = 0;
    return {Status::kComplete, given - in.size(), {}, done};
  } catch (Invalid& e) {
    in_request_ = false;
    return {Status::kInvalid, given - in.size(), std::move(e.why)};
  }
}

}  // namespace ddprun::rendezvous
